"""Turn train-data columns into padded micro-batches and response-token log-probs.

Sequences are right-padded within a micro-batch; the log-prob of response token t comes
from the logits at position t-1 (next-token prediction), divided by the rollout
temperature exactly as the engine does when it reports sampling log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from slime.algorithms.losses import compute_entropy, compute_log_probs


@dataclass
class MicroBatch:
    input_ids: Tensor  # [B, L] right-padded
    attention_mask: Tensor  # [B, L]
    prompt_lengths: list[int]
    response_lengths: list[int]
    loss_masks: list[Tensor]  # each [R_i]
    indices: list[int]  # positions of these samples in the rollout's data

    @property
    def size(self) -> int:
        return len(self.response_lengths)


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


def response_log_probs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Packed [sum R_i] log-probs (and entropies) of every sample's response tokens."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
    # Only response positions matter; gather their logits before the (fp32) softmax.
    rows, cols = [], []
    for row, (p, r) in enumerate(zip(mb.prompt_lengths, mb.response_lengths)):
        rows += [row] * r
        cols += range(p - 1, p + r - 1)
    rows_t, cols_t = torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(cols, dtype=torch.long)
    picked = logits[rows_t, cols_t]  # [T, V]
    targets = mb.input_ids[rows_t, cols_t + 1]
    log_probs = compute_log_probs(picked, targets, temperature=temperature)
    entropy = compute_entropy(picked, temperature=temperature) if with_entropy else None
    return log_probs, entropy


def split_packed(x: Tensor, response_lengths: Sequence[int]) -> list[Tensor]:
    return list(torch.split(x, [int(r) for r in response_lengths]))


def pack(per_sample: Sequence[Sequence[float]] | Sequence[Tensor], indices: Sequence[int]) -> Tensor:
    parts = [torch.as_tensor(per_sample[i], dtype=torch.float32) for i in indices]
    return torch.cat(parts) if parts else torch.zeros(0)
