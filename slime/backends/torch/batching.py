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

import contextlib

from dataclasses import dataclass
from typing import Any, Sequence

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

    def __post_init__(self) -> None:
        if self.rows is None:  # padded: sample i is row i, its response starts at prompt_length
            rows, cols = [], []
            for row, (p, r) in enumerate(zip(self.prompt_lengths, self.response_lengths)):
                rows += [row] * r
                cols += range(p - 1, p + r - 1)
            self.rows = torch.as_tensor(rows, dtype=torch.long)
            self.cols = torch.as_tensor(cols, dtype=torch.long)

    @property
    def size(self) -> int:
        return len(self.response_lengths)

    @property
    def targets(self) -> Tensor:
        return self.input_ids[self.rows, self.cols + 1]

    def forward(self, model: torch.nn.Module) -> Tensor:
        """Model output ``[B, L, ...]`` (logits, or values for a critic) for this layout."""
        kw = {"position_ids": self.position_ids} if self.position_ids is not None else {}
        out = model(input_ids=self.input_ids, attention_mask=self.attention_mask, use_cache=False, **kw)
        return out.logits if hasattr(out, "logits") else out


def training_precision(args: Any) -> contextlib.AbstractContextManager:
    """Megatron's `--bf16` / `--fp16` (mixed precision): the training forward and backward compute
    in that dtype (torch autocast on CPU) while parameters, gradients and the optimizer state stay
    fp32 (the master weights). Neither: fp32 throughout."""
    if args.bf16 or args.fp16:
        return torch.autocast("cpu", dtype=torch.bfloat16 if args.bf16 else torch.float16)
    return contextlib.nullcontext()


def make_micro_batch(data: dict[str, Any], indices: Sequence[int], pad_id: int = 0) -> MicroBatch:
    tokens = [data["tokens"][i] for i in indices]
    resp = [int(data["response_lengths"][i]) for i in indices]
    max_len = max(len(t) for t in tokens)
    ids = torch.full((len(tokens), max_len), pad_id, dtype=torch.long)
    att = torch.zeros((len(tokens), max_len), dtype=torch.long)
    for row, t in enumerate(tokens):
        ids[row, : len(t)] = torch.as_tensor(t, dtype=torch.long)
        att[row, : len(t)] = 1
    return MicroBatch(
        input_ids=ids,
        attention_mask=att,
        prompt_lengths=[len(t) - r for t, r in zip(tokens, resp)],
        response_lengths=resp,
        loss_masks=[torch.as_tensor(data["loss_masks"][i], dtype=torch.float32) for i in indices],
        indices=list(indices),
    )


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
    for n, r in zip(lengths, resp):
        cols += range(start + n - r - 1, start + n - 1)
        start += n
    return MicroBatch(
        input_ids=ids,
        attention_mask=mask,
        prompt_lengths=[n - r for n, r in zip(lengths, resp)],
        response_lengths=resp,
        loss_masks=[torch.as_tensor(data["loss_masks"][i], dtype=torch.float32) for i in indices],
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


def build_micro_batch(data: dict[str, Any], indices: Sequence[int], packed: bool, pad_id: int = 0) -> MicroBatch:
    return make_packed_micro_batch(data, indices) if packed else make_micro_batch(data, indices, pad_id)


def response_log_probs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Packed [sum R_i] log-probs (and entropies) of every sample's response tokens."""
    # Only response positions matter; gather their logits before the (fp32) softmax.
    picked = mb.forward(model)[mb.rows, mb.cols]  # [T, V]
    chunk = chunk_size if chunk_size and chunk_size > 0 else None
    log_probs = compute_log_probs(picked, mb.targets, temperature=temperature, chunk_size=chunk)
    entropy = compute_entropy(picked, temperature=temperature) if with_entropy else None
    return log_probs, entropy


def pack(per_sample: Sequence[Sequence[float]] | Sequence[Tensor], indices: Sequence[int]) -> Tensor:
    parts = [torch.as_tensor(per_sample[i], dtype=torch.float32) for i in indices]
    return torch.cat(parts) if parts else torch.zeros(0)
