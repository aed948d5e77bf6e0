"""Token log-probs, entropy, slime's loss reductions, the PPO-clip and CISPO policy losses and the SFT loss.

Per-token tensors of a micro-batch are *packed*: the response tokens of every sample are
concatenated into one flat ``[total_tokens]`` tensor, and ``response_lengths`` says where each
sample's slice ends. ``loss_masks[i]`` (length ``response_lengths[i]``, 1 = train on this
token) removes tool / observation tokens from the loss.

Reductions (slime's ``get_sum_of_sample_mean``):

* default (per-sample mean): ``sum_i mean_{t in mask_i} x_t``, then divided by the number of
  samples of the *global* batch — done by :func:`reduce_loss` (``num_samples``) or by the caller;
* ``--calculate-per-token-loss``: ``sum_i sum_{t in mask_i} x_t``, then divided by the number of
  unmasked tokens of the global batch (``num_tokens``).

Summing inside a micro-batch and dividing once by a global count keeps the loss independent of
how samples are split into micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "compute_log_probs",
    "compute_entropy",
    "masked_mean",
    "sum_of_sample_mean",
    "sum_of_token",
    "reduce_loss",
    "policy_loss_ppo_clip",
    "ppo_clip_from_kl",
    "cispo_loss",
    "sequence_ppo_kl",
    "tis_weights",
    "opsm_mask",
    "value_loss_clipped",
    "sft_loss",
]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _fp32(x: Tensor) -> Tensor:
    """Upcast half precision to float32; keep float32 / float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def compute_log_probs(
    logits: Tensor,
    target_ids: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """``log softmax(logits / T)[target]`` = ``z[target] - logsumexp(z)`` with ``z = logits / T``.

    ``logits``: ``[..., T, V]``; ``target_ids``: ``[..., T]``; returns ``[..., T]`` in float32
    (float64 if the logits are). The full ``[.., V]`` log-softmax is never materialized; with
    ``chunk_size`` the fp32 copy of the logits is made ``chunk_size`` rows at a time.
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != target_ids.shape:
        raise ValueError(
            f"logits shape {tuple(logits.shape)} does not match target_ids shape {tuple(target_ids.shape)} + [V]"
        )
    out_shape = target_ids.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = target_ids.reshape(-1).long()
    rows = flat_logits.shape[0]
    step = rows if not chunk_size or chunk_size >= rows else int(chunk_size)
    pieces = []
    for start in range(0, max(rows, 1), max(step, 1)):
        z = _fp32(flat_logits[start : start + step])
        if temperature != 1.0:
            z = z / temperature
        tgt = flat_targets[start : start + step]
        picked = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - torch.logsumexp(z, dim=-1))
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return out.reshape(out_shape)


def compute_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of ``softmax(logits / T)`` over the last dim: ``H = logsumexp(z) - sum_v p_v z_v``.

    Computed in float32 (float64 if given); ``-inf`` logits (masked vocabulary) contribute 0.
    Returns ``[..., T]``.
    """
    _check_temperature(temperature)
    z = _fp32(logits)
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    z_finite = torch.where(torch.isneginf(z), torch.zeros_like(z), z)
    return lse.squeeze(-1) - (p * z_finite).sum(dim=-1)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """``sum(x * mask) / max(sum(mask), 1)`` over ``dim`` (all dims if None).

    Masked-out positions are excluded even if they hold NaN/inf; an empty selection gives 0.
    """
    m = mask.to(torch.bool) if mask.dtype != torch.bool else mask
    m = m.expand_as(x) if m.shape != x.shape else m
    xz = torch.where(m, x, torch.zeros_like(x))
    w = m.to(xz.dtype)
    if dim is None:
        return xz.sum() / w.sum().clamp_min(1)
    return xz.sum(dim=dim) / w.sum(dim=dim).clamp_min(1)


def _packed_mask(loss_masks: Sequence[Tensor | Sequence[int]], lengths: list[int], device) -> Tensor:
    """The masks as one packed boolean ``[total_tokens]`` tensor, each checked against its length."""
    for i, (m, n) in enumerate(zip(loss_masks, lengths, strict=True)):
        shape = tuple(m.shape) if isinstance(m, Tensor) else (len(m),)
        if shape != (n,):
            raise ValueError(f"loss mask {i} has shape {shape}, expected ({n},)")
    if not lengths:
        return torch.zeros(0, dtype=torch.bool, device=device)
    tensors = [m for m in loss_masks if isinstance(m, Tensor)]
    if len(tensors) == len(loss_masks):
        return torch.cat(tensors).to(device=device, dtype=torch.bool)
    return torch.as_tensor([bool(v) for m in loss_masks for v in m], dtype=torch.bool, device=device)


def _segments(
    x: Tensor, response_lengths: Sequence[int], loss_masks: Sequence[Tensor | Sequence[int]]
) -> tuple[Tensor, Tensor, list[int]]:
    """Validate packed ``x`` against the lengths and masks; return ``(mask [T] bool, sample id [T], lengths)``.

    One vectorised pass over every sample (no per-sample tensor ops: with hundreds of short
    samples per micro-batch those loops, and their autograd nodes, cost more than the model)."""
    if x.dim() != 1:
        raise ValueError(f"packed per-token tensor must be 1-D [total_tokens], got shape {tuple(x.shape)}")
    lengths = [int(n) for n in response_lengths]
    if len(lengths) != len(loss_masks):
        raise ValueError(f"{len(lengths)} response lengths but {len(loss_masks)} loss masks")
    if sum(lengths) != x.shape[0]:
        raise ValueError(f"response lengths sum to {sum(lengths)} but the packed tensor has {x.shape[0]} tokens")
    mask = _packed_mask(loss_masks, lengths, x.device)
    sample = torch.repeat_interleave(
        torch.arange(len(lengths), device=x.device), torch.as_tensor(lengths, dtype=torch.long, device=x.device)
    )
    return mask, sample, lengths


def _per_sample_sums(x: Tensor, mask: Tensor, sample: Tensor, num: int) -> tuple[Tensor, Tensor]:
    """Per-sample ``sum_t mask_t x_t`` (differentiable) and ``sum_t mask_t``; masked-out NaN/inf ignored."""
    kept = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    sums = x.new_zeros(num).index_add(0, sample, kept)
    counts = torch.zeros(num, dtype=x.dtype, device=x.device).index_add(0, sample, mask.to(x.dtype))
    return sums, counts


def sum_of_sample_mean(
    x: Tensor,
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor | Sequence[int]],
    sample_denoms: Sequence[float] | None = None,
) -> Tensor:
    """``sum_i (sum_t mask_it x_it) / max(d_i, 1)``: the SUM of per-sample masked means.

    ``d_i`` is ``sum_t mask_it`` unless ``sample_denoms`` gives it: slime keeps the denominators of
    the masks the rollout delivered when a TIS / rejection hook zeroes tokens of the numerator.
    The caller divides by the number of samples of the global batch (see :func:`reduce_loss`).
    Empty or fully-masked samples contribute exactly 0.
    """
    mask, sample, lengths = _segments(x, response_lengths, loss_masks)
    if sample_denoms is not None and len(sample_denoms) != len(lengths):
        raise ValueError(f"{len(sample_denoms)} sample denominators but {len(lengths)} samples")
    sums, counts = _per_sample_sums(x, mask, sample, len(lengths))
    denoms = (
        counts
        if sample_denoms is None
        else torch.as_tensor([float(d) for d in sample_denoms], dtype=x.dtype, device=x.device)
    )
    return (sums / denoms.clamp_min(1)).sum()


def sum_of_token(x: Tensor, response_lengths: Sequence[int], loss_masks: Sequence[Tensor | Sequence[int]]) -> Tensor:
    """``sum_i sum_t mask_it x_it``: the SUM over unmasked tokens (``--calculate-per-token-loss``).

    The caller divides by the number of unmasked tokens of the global batch (see :func:`reduce_loss`).
    """
    mask, _, _ = _segments(x, response_lengths, loss_masks)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def reduce_loss(
    x: Tensor,
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor | Sequence[int]],
    *,
    calculate_per_token_loss: bool = False,
    num_samples: int | None = None,
    num_tokens: int | float | None = None,
    sample_denoms: Sequence[float] | None = None,
) -> Tensor:
    """Scalar loss from per-token ``x`` with slime's two reductions, denominators explicit.

    * per-sample (default): ``sum_of_sample_mean(x, sample_denoms) / num_samples``
      (``num_samples`` defaults to ``len(response_lengths)``: pass the global batch size when
      this is one micro-batch of it);
    * per-token: ``sum_of_token(x) / num_tokens`` (``num_tokens`` defaults to the unmasked tokens
      here, at least 1).
    """
    if calculate_per_token_loss:
        s = sum_of_token(x, response_lengths, loss_masks)
        if num_tokens is None:
            num_tokens = sum(int(torch.as_tensor(m).to(torch.bool).sum()) for m in loss_masks)
        return s / max(num_tokens, 1)
    s = sum_of_sample_mean(x, response_lengths, loss_masks, sample_denoms)
    if num_samples is None:
        num_samples = len(response_lengths)
    return s / max(num_samples, 1)


def policy_loss_ppo_clip(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO-clip loss (slime's ``compute_policy_loss``). Returns ``(pg_losses, clipfrac, ppo_kl)``.

    ``ratio = exp(log_probs - old_log_probs)``;
    ``loss = max(-ratio * A, -clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)``
    (= ``-min(ratio*A, clip(ratio)*A)``; ``eps_clip_high`` defaults to ``eps_clip``, DAPO's clip-higher).
    Dual clip (``eps_clip_c > 1``): where ``A < 0``, ``loss = min(loss, -eps_clip_c * A)``, which bounds
    the loss of a very large ratio with a negative advantage.

    ``clipfrac`` is 1.0 where the clipped term is strictly larger than the unclipped one, i.e. clipping
    changed the loss (and zeroed the gradient). A ratio exactly at ``1 +/- eps`` gives equal terms and
    counts as NOT clipped (its gradient is the unclipped one). Dual clip does not change ``clipfrac``.
    ``ppo_kl = old_log_probs - log_probs`` (still attached to the graph: detach before logging).
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c (dual-clip lower bound) must be > 1.0, got {eps_clip_c}")
    if not (log_probs.shape == old_log_probs.shape == advantages.shape):
        raise ValueError(
            f"shape mismatch: log_probs {tuple(log_probs.shape)}, old_log_probs {tuple(old_log_probs.shape)}, "
            f"advantages {tuple(advantages.shape)}"
        )
    ppo_kl = old_log_probs - log_probs
    pg_losses, clipfrac = ppo_clip_from_kl(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)
    return pg_losses, clipfrac, ppo_kl


def ppo_clip_from_kl(
    ppo_kl: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The PPO-clip loss of :func:`policy_loss_ppo_clip` from ``ppo_kl = old - new`` (token or sequence level).

    GSPO passes the sequence-level ``ppo_kl`` of :func:`sequence_ppo_kl`, so the ratio is
    ``exp(mean_t(new - old))`` for every token of a sample. Returns ``(pg_losses, clipfrac)``.
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c (dual-clip lower bound) must be > 1.0, got {eps_clip_c}")
    if ppo_kl.shape != advantages.shape:
        raise ValueError(f"shape mismatch: ppo_kl {tuple(ppo_kl.shape)}, advantages {tuple(advantages.shape)}")
    ratio = torch.exp(-ppo_kl)
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    clipfrac = torch.gt(pg_losses2, pg_losses1).to(pg_losses.dtype)
    if eps_clip_c is not None:
        pg_losses3 = -eps_clip_c * advantages
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, pg_losses3), pg_losses)
    return pg_losses, clipfrac


def cispo_loss(
    ppo_kl: Tensor,
    log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585), slime's ``--advantage-estimator cispo``.

    ``w = clip(exp(-ppo_kl), 1 - eps_clip, 1 + eps_clip_high)`` under stop-gradient, and
    ``loss = -w * A * log_probs``: the gradient is ``-w * A * grad log_probs`` on every token, so a
    clipped token still teaches (PPO's clip zeroes its gradient). ``eps_clip >= 1`` turns the lower
    bound off (canonical CISPO). ``clipfrac`` is 1 wherever the clip changed the ratio.
    Returns ``(pg_losses, clipfrac)``.
    """
    if not (ppo_kl.shape == log_probs.shape == advantages.shape):
        raise ValueError(
            f"shape mismatch: ppo_kl {tuple(ppo_kl.shape)}, log_probs {tuple(log_probs.shape)}, "
            f"advantages {tuple(advantages.shape)}"
        )
    ratio = torch.exp(-ppo_kl.detach())
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    pg_losses = -weight * advantages * log_probs
    return pg_losses, (weight != ratio).to(pg_losses.dtype)


def _per_sample_masked_mean(
    x: Tensor, response_lengths: Sequence[int], loss_masks: Sequence[Tensor | Sequence[int]]
) -> tuple[Tensor, Tensor, Tensor]:
    """Each sample's masked mean of packed ``x`` (``[num_samples]``), with the packed mask and sample ids."""
    mask, sample, lengths = _segments(x, response_lengths, loss_masks)
    sums, counts = _per_sample_sums(x, mask, sample, len(lengths))
    return sums / counts.clamp_min(1), mask, sample


def sequence_ppo_kl(
    log_probs: Tensor,
    old_log_probs: Tensor,
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor | Sequence[int]],
) -> Tensor:
    """GSPO (https://arxiv.org/abs/2507.18071): each sample's masked mean of ``old - new``, on all its tokens.

    Packed ``[total_tokens]`` in, packed out; gradients flow through every trained token of the sample.
    A fully masked sample gets 0 (ratio 1).
    """
    means, _, sample = _per_sample_masked_mean(old_log_probs - log_probs, response_lengths, loss_masks)
    return means[sample]


def tis_weights(
    train_log_probs: Tensor, rollout_log_probs: Tensor, clip: float, clip_low: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance sampling for the train/rollout mismatch (https://fengyao.notion.site/off-policy-rl).

    ``w = clamp(exp(train - rollout), clip_low, clip)`` multiplies the per-token policy loss (no gradient
    through ``w``). Metrics (per token): ``tis`` (the raw ratio), ``tis_clipfrac`` (1 where clamping
    changed it), ``tis_abs`` (``|ratio - 1|``).
    """
    if clip < clip_low:
        raise ValueError(f"tis clip ({clip}) must be >= tis clip low ({clip_low})")
    ratio = torch.exp(train_log_probs.detach() - rollout_log_probs.detach())
    w = ratio.clamp(min=clip_low, max=clip)
    return w, {"tis": ratio, "tis_clipfrac": (w != ratio).to(ratio.dtype), "tis_abs": (ratio - 1).abs()}


def opsm_mask(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor | Sequence[int]],
    delta: float,
) -> Tensor:
    """Off-policy sequence masking (slime's ``--use-opsm``): 0 on the trained tokens with a negative
    advantage of a sample whose masked mean ``old - new`` exceeds ``delta``; 1 elsewhere.

    Such a sample has drifted too far from the policy that generated it for its negative signal to be
    trusted. Returned packed and detached; the fraction of zeros is ``train/opsm_clipfrac``.
    """
    seq_kl, mask, sample = _per_sample_masked_mean((old_log_probs - log_probs).detach(), response_lengths, loss_masks)
    drop = (advantages.detach() < 0) & mask & (seq_kl > delta)[sample]
    return 1.0 - drop.to(log_probs.dtype)


def value_loss_clipped(values: Tensor, old_values: Tensor, returns: Tensor, value_clip: float) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss per token: ``max((V - R)^2, (V_old + clip(V - V_old, +-value_clip) - R)^2)``.

    Returns ``(loss, clipfrac)``; ``clipfrac`` is 1 where ``|V - V_old| > value_clip``.
    """
    if not (values.shape == old_values.shape == returns.shape):
        raise ValueError(
            f"shape mismatch: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns {tuple(returns.shape)}"
        )
    old_values, returns = old_values.detach(), returns.detach()
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    loss = torch.maximum((values - returns).square(), (clipped - returns).square())
    clipfrac = ((values - old_values).abs() > value_clip).to(values.dtype)
    return loss, clipfrac


def sft_loss(
    log_probs: Tensor,
    response_lengths: Sequence[int],
    loss_masks: Sequence[Tensor | Sequence[int]],
    *,
    calculate_per_token_loss: bool = False,
    num_samples: int | None = None,
    num_tokens: int | float | None = None,
    sample_denoms: Sequence[float] | None = None,
) -> Tensor:
    """Masked negative log-likelihood: ``reduce_loss(-log_probs, ...)`` (same reductions and denominators)."""
    return reduce_loss(
        -log_probs,
        response_lengths,
        loss_masks,
        calculate_per_token_loss=calculate_per_token_loss,
        num_samples=num_samples,
        num_tokens=num_tokens,
        sample_denoms=sample_denoms,
    )
