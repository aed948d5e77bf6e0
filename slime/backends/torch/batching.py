"""Turn train-data columns into micro-batches and response-token log-probs.

Two layouts, one interface:

* padded (``--micro-batch-size``): sequences right-padded into ``[B, L]``;
* packed (``--use-dynamic-batch-size``): sequences concatenated into one ``[1, sum L]`` row with
  positions restarting at 0 and a block-diagonal causal mask, so no token is padding; micro-batches
  are cut when the next sample would exceed ``--max-tokens-per-gpu``.

Either way ``MicroBatch.rows/cols`` index the output positions that predict each response token
(position t-1 predicts token t), so the losses never see the layout. Log-probs are divided by the
rollout temperature exactly as the engine does when it reports sampling log-probs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from slime.algorithms.losses import compute_entropy, compute_log_probs


@dataclass
class MicroBatch:
    input_ids: Tensor  # [B, L] right-padded, or [1, sum L] packed
    attention_mask: Tensor  # [B, L], or [1, 1, L, L] block-diagonal causal (packed)
    prompt_lengths: list[int]
    response_lengths: list[int]
    loss_masks: list[Tensor]  # each [R_i]
    indices: list[int]  # positions of these samples in the rollout's data
    rows: Tensor | None = None  # [sum R_i]: output row that predicts each response token
    cols: Tensor | None = None  # [sum R_i]: output position that predicts it
    position_ids: Tensor | None = None  # packed only
    # padded only: each sample's prompt among the batch's distinct prompts, when some repeat (the n
    # samples of a prompt): their prompt is then run once (`_shared_prompt_logits`); None: no repeats
    prompt_of: Tensor | None = None

    def __post_init__(self) -> None:
        if self.rows is None:  # padded: sample i is row i, its response starts at prompt_length
            resp = torch.as_tensor(self.response_lengths, dtype=torch.long)
            self.rows = torch.repeat_interleave(torch.arange(len(self.response_lengths)), resp)
            first = torch.cumsum(resp, 0) - resp  # where each sample's tokens start in the packed order
            offset = torch.arange(int(resp.sum())) - torch.repeat_interleave(first, resp)
            self.cols = (
                torch.repeat_interleave(torch.as_tensor(self.prompt_lengths, dtype=torch.long) - 1, resp) + offset
            )

    @property
    def size(self) -> int:
        return len(self.response_lengths)

    @property
    def targets(self) -> Tensor:
        return self.input_ids[self.rows, self.cols + 1]

    def forward(self, model: torch.nn.Module, **extra: Any) -> Tensor:
        """Model output ``[B, L, ...]`` (logits, or values for a critic) for this layout."""
        kw = {"position_ids": self.position_ids} if self.position_ids is not None else {}
        out = model(input_ids=self.input_ids, attention_mask=self.attention_mask, use_cache=False, **kw, **extra)
        return out.logits if hasattr(out, "logits") else out

    def response_logits(self, model: torch.nn.Module) -> Tensor:
        """``[sum R_i, V]``: the logits of the positions that predict response tokens, in packed order.
        The output layer runs on those positions only where the model can be told (transformers'
        ``logits_to_keep`` with a boolean mask): prompts are most of a sequence, and the output
        layer is a large share of a small model's work."""
        if not _keeps_logits(model):
            return self.forward(model)[self.rows, self.cols]
        if self.prompt_of is not None and _can_share_prompts(model):
            return self._shared_prompt_logits(model)
        keep = torch.zeros(self.input_ids.shape, dtype=torch.bool, device=self.input_ids.device)
        keep[self.rows, self.cols] = True  # rows/cols are in row-major order: the flattened output's order
        return self.forward(model, logits_to_keep=keep)

    def _shared_prompt_logits(self, model: torch.nn.Module) -> Tensor:
        """`response_logits` with each distinct prompt run once. Two forwards: the distinct prompts
        (right-padded) keep their keys and values, which are then indexed out to every sample of
        that prompt and extended by the responses (right-padded; the prompts' padding masked out,
        positions continuing from each prompt's length). The prompt's last position predicts the
        first response token, the responses' positions the rest. Gradients reach the prompt's
        keys and values from all its samples, summed: the same numbers as one forward per sample
        (to float rounding; tested), with (n - 1) fewer copies of each prompt to compute."""
        prompt_of, device = self.prompt_of, self.input_ids.device
        n = self.size
        prompt_len = torch.as_tensor(self.prompt_lengths, dtype=torch.long, device=device)
        resp_len = torch.as_tensor(self.response_lengths, dtype=torch.long, device=device)
        first = torch.full((int(prompt_of.max()) + 1,), n, dtype=torch.long, device=device).scatter_reduce(
            0, prompt_of, torch.arange(n, device=device), reduce="amin"
        )  # each prompt's first sample
        p_len, width = prompt_len[first], int(prompt_len.max())
        p_mask = torch.arange(width, device=device)[None] < p_len[:, None]
        p_keep = torch.zeros_like(p_mask)
        p_keep[torch.arange(len(first), device=device), p_len - 1] = True
        head = model(
            input_ids=torch.where(p_mask, self.input_ids[first, :width], 0),
            attention_mask=p_mask.long(),
            use_cache=True,
            logits_to_keep=p_keep,
        )
        cache = head.cache if "cache" in head else head.past_key_values
        cache.batch_select_indices(prompt_of)  # every sample gets its prompt's keys and values
        # a response's last token predicts nothing wanted here: only tokens 0..R-2 are run
        r_width = int(resp_len.max()) - 1
        tail = head.logits[:0]
        if r_width > 0:
            steps = torch.arange(r_width, device=device)[None]
            r_mask = steps < (resp_len - 1)[:, None]
            at = (prompt_len[:, None] + steps).clamp(max=self.input_ids.shape[1] - 1)
            tail = model(
                input_ids=torch.where(r_mask, self.input_ids.gather(1, at), 0),
                attention_mask=torch.cat([p_mask[prompt_of], r_mask], 1).long(),
                position_ids=prompt_len[:, None] + steps,
                use_cache=True,
                logits_to_keep=r_mask,
                **{_cache_kwarg(model): cache},
            ).logits
        # packed order: each sample's first response token (the prompt's last position), then the rest
        starts = torch.cumsum(resp_len, 0) - resp_len
        order = torch.empty(int(resp_len.sum()), dtype=torch.long, device=device)
        is_start = torch.zeros_like(order, dtype=torch.bool)
        is_start[starts] = True
        order[starts] = torch.arange(n, device=device)
        order[~is_start] = n + torch.arange(len(order) - n, device=device)
        return torch.cat([head.logits[prompt_of], tail])[order]


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names a forward's cache `cache`; before, `past_key_values`."""
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def _can_share_prompts(model: torch.nn.Module) -> bool:
    """A transformers causal LM whose forward returns a per-layer key/value cache that can be
    indexed by sample: not while gradient checkpointing (transformers then turns the cache off),
    nor with sliding-window attention (its cache keeps only the window)."""
    params = _forward_parameters(type(model))
    config = getattr(model, "config", None)
    return (
        ("cache" in params or "past_key_values" in params)
        and "position_ids" in params
        and not _checkpointing(model)
        and not getattr(config, "use_sliding_window", False)
        and getattr(config, "sliding_window", None) is None
    )


def _checkpointing(model: torch.nn.Module) -> bool:
    name = "is_activation_checkpointing"  # transformers >= 5.2x; the older name warns there
    if not hasattr(type(model), name):
        name = "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (transformers' causal LMs do)."""
    return "logits_to_keep" in _forward_parameters(type(model))


@functools.cache
def _forward_parameters(cls: type) -> frozenset[str]:
    """The names a model class's forward takes (asked once per class: every micro-batch asks)."""
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def make_micro_batch(
    data: dict[str, Any], indices: Sequence[int], pad_id: int = 0, share_prompts: bool = False
) -> MicroBatch:
    """Right-padded ``[B, L]``. `share_prompts` (``--share-prompt-forward``): samples whose prompt
    tokens are identical get one forward of that prompt."""
    tokens = [data["tokens"][i] for i in indices]
    resp = [int(data["response_lengths"][i]) for i in indices]
    lengths = [len(t) for t in tokens]
    max_len = max(lengths)
    # one scatter of every token into the padded grid, not one copy per row
    lengths_t = torch.as_tensor(lengths, dtype=torch.long)
    att = (torch.arange(max_len)[None, :] < lengths_t[:, None]).to(torch.long)
    ids = torch.full((len(tokens), max_len), pad_id, dtype=torch.long)
    ids[att.bool()] = pack(tokens, range(len(tokens)), torch.long)
    return MicroBatch(
        input_ids=ids,
        attention_mask=att,
        prompt_lengths=[n - r for n, r in zip(lengths, resp, strict=True)],
        response_lengths=resp,
        loss_masks=loss_mask_column(data, indices, resp),
        indices=list(indices),
        prompt_of=_repeated_prompts(tokens, resp) if share_prompts else None,
    )


def _repeated_prompts(tokens: list[Sequence[int]], response_lengths: list[int]) -> Tensor | None:
    """Each sample's index among the distinct prompts (by their tokens), or None when no prompt
    repeats, or a response is empty (its first token would have no position to come from)."""
    if not tokens or min(response_lengths) < 1:
        return None
    seen: dict[tuple, int] = {}
    of = [seen.setdefault(tuple(t[: len(t) - r]), len(seen)) for t, r in zip(tokens, response_lengths, strict=True)]
    return torch.as_tensor(of, dtype=torch.long) if len(seen) < len(of) else None


def loss_mask_column(data: dict[str, Any], indices: Sequence[int], response_lengths: list[int]) -> list[Tensor]:
    """Each sample's loss mask as a float tensor (views of one packed tensor), its length checked."""
    for i, n in zip(indices, response_lengths, strict=True):
        if len(data["loss_masks"][i]) != n:
            raise ValueError(f"sample {i}: loss mask has {len(data['loss_masks'][i])} entries, its response {n} tokens")
    return list(torch.split(pack(data["loss_masks"], indices), response_lengths))


def make_packed_micro_batch(data: dict[str, Any], indices: Sequence[int]) -> MicroBatch:
    """All samples in one row, no padding: positions restart per sample, attention stays inside it."""
    tokens = [data["tokens"][i] for i in indices]
    resp = [int(data["response_lengths"][i]) for i in indices]
    lengths = [len(t) for t in tokens]
    total = sum(lengths)
    ids = torch.as_tensor([tok for t in tokens for tok in t], dtype=torch.long).view(1, total)
    segment = torch.repeat_interleave(torch.arange(len(tokens)), torch.as_tensor(lengths))
    position = torch.cat([torch.arange(n) for n in lengths]).view(1, total)
    causal = torch.arange(total)[:, None] >= torch.arange(total)[None, :]
    mask = (causal & (segment[:, None] == segment[None, :]))[None, None]
    cols, start = [], 0
    for n, r in zip(lengths, resp, strict=True):
        cols += range(start + n - r - 1, start + n - 1)
        start += n
    return MicroBatch(
        input_ids=ids,
        attention_mask=mask,
        prompt_lengths=[n - r for n, r in zip(lengths, resp, strict=True)],
        response_lengths=resp,
        loss_masks=loss_mask_column(data, indices, resp),
        indices=list(indices),
        rows=torch.zeros(len(cols), dtype=torch.long),
        cols=torch.as_tensor(cols, dtype=torch.long),
        position_ids=position,
    )


def plan_micro_batches(
    data: dict[str, Any], indices: Sequence[int], micro_batch_size: int, max_tokens: int | None = None
) -> list[list[int]]:
    """Split one step's samples: fixed ``micro_batch_size``, or greedy in order under ``max_tokens``
    (prompt + response tokens). A sample longer than the budget gets a micro-batch of its own."""
    if max_tokens is None:
        return [list(indices[i : i + micro_batch_size]) for i in range(0, len(indices), micro_batch_size)]
    plan: list[list[int]] = []
    used = 0
    for i in indices:
        n = len(data["tokens"][i])
        if plan and used + n <= max_tokens:
            plan[-1].append(i)
            used += n
        else:
            plan.append([i])
            used = n
    return plan


def build_micro_batch(
    data: dict[str, Any], indices: Sequence[int], packed: bool, pad_id: int = 0, share_prompts: bool = False
) -> MicroBatch:
    if packed:
        return make_packed_micro_batch(data, indices)
    return make_micro_batch(data, indices, pad_id, share_prompts)


def response_log_probs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Packed [sum R_i] log-probs (and entropies) of every sample's response tokens. With
    ``entropy_grad=False`` the entropy is a metric only (no graph: ``--entropy-coef 0``)."""
    # Only response positions matter; gather their logits before the (fp32) softmax.
    picked = mb.response_logits(model)  # [T, V]
    chunk = chunk_size if chunk_size and chunk_size > 0 else None
    log_probs = compute_log_probs(picked, mb.targets, temperature=temperature, chunk_size=chunk)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = compute_entropy(picked if entropy_grad else picked.detach(), temperature=temperature)
    return log_probs, entropy


def pack(
    per_sample: Sequence[Sequence[float]] | Sequence[Tensor],
    indices: Sequence[int],
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Samples ``indices`` of a per-sample column (a list: one entry per sample), concatenated into
    one flat tensor: one ``cat`` for tensors, one ``tensor`` call for Python lists (no per-sample
    tensor ops)."""
    if not isinstance(per_sample, (list, tuple)):
        raise TypeError(
            f"pack: a per-sample column must be a list with one entry per sample, got "
            f"{type(per_sample).__name__}"
            + (" (keyed by sample: build it as a list)" if isinstance(per_sample, dict) else "")
        )
    parts = [per_sample[i] for i in indices]
    if not parts:
        return torch.zeros(0, dtype=dtype)
    if all(isinstance(p, Tensor) and p.dim() == 1 for p in parts):
        return torch.cat(parts).to(dtype)
    if all(isinstance(p, Tensor) for p in parts):
        return torch.cat([p.reshape(-1) for p in parts]).to(dtype)
    return torch.as_tensor(
        list(chain.from_iterable(p.reshape(-1).tolist() if isinstance(p, Tensor) else p for p in parts)), dtype=dtype
    )
