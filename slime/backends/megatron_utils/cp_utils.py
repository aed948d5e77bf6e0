"""slime's context-parallel helpers (`slime.backends.megatron_utils.cp_utils`), with slime's names
and signatures, for hook code such as slime's train_infer_mismatch example (`mis.py` gathers and
slices log-probs through them).

This backend trains without context parallelism: the size is 1 and every rank holds whole
sequences, so gathering over the CP group and slicing for a CP rank return their input, and
`get_sum_of_sample_mean` masks and averages whole responses. A run asking for a context-parallel
size above 1 is refused by `configure_context_parallel(args)`; the offsets helper, which only
means something across several CP ranks, refuses at size 1 (slime asserts there too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slime.errors import SlimeError

_cp_size = 1


def _refuse(size: Any) -> SlimeError:
    return SlimeError(
        f"context parallelism is not supported here (--context-parallel-size {size}): this backend trains "
        f"every sequence whole on one rank; use --context-parallel-size 1 (more data-parallel ranks, or "
        f"--max-tokens-per-gpu for long sequences)"
    )


def configure_context_parallel(args: Any) -> None:
    """Take the context-parallel size from `args` (Megatron's --context-parallel-size); above 1 it
    raises, since nothing here splits a sequence across ranks."""
    global _cp_size
    size = args.context_parallel_size
    if size != 1:
        raise _refuse(size)
    _cp_size = size


def get_context_parallel_world_size() -> int:
    """The context-parallel group's size (Megatron's `mpu` name): always 1 here."""
    return _cp_size


def get_context_parallel_rank() -> int:
    """This rank's place in its context-parallel group (Megatron's `mpu` name): always 0 here."""
    return 0


def get_logits_and_tokens_offset_with_cp(total_length: int, response_length: int):
    """slime's per-CP-rank chunk offsets; they exist only for a context-parallel size above 1,
    which this backend does not run."""
    raise _refuse(get_context_parallel_world_size())


def get_sum_of_sample_mean(
    total_lengths: list[int],
    response_lengths: list[int],
    loss_masks: list[torch.Tensor],
    sample_denoms: list[torch.Tensor] | torch.Tensor | None = None,
    calculate_per_token_loss: bool = False,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A reducer over a batch's concatenated per-token values `x` (split by `response_lengths`):
    the sum over samples of each sample's masked sum divided by its denominator (its own mask's
    sum unless `sample_denoms` gives one; a zero denominator counts as 1), or, with
    `calculate_per_token_loss`, the plain sum of masked values."""
    if get_context_parallel_world_size() != 1:
        raise _refuse(get_context_parallel_world_size())
    denoms = [m.sum() for m in loss_masks] if sample_denoms is None else sample_denoms

    def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
        parts = zip(x.split(response_lengths, dim=0), loss_masks, denoms, strict=False)
        return sum((xi * mi).sum() / torch.clamp_min(d, 1) for xi, mi, d in parts)

    def sum_of_token(x: torch.Tensor) -> torch.Tensor:
        parts = zip(x.split(response_lengths, dim=0), loss_masks, strict=False)
        return sum((xi * mi).sum() for xi, mi in parts)

    return sum_of_token if calculate_per_token_loss else sum_of_sample_mean


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """A response's values gathered over the CP group: at size 1 this rank already holds them all."""
    if get_context_parallel_world_size() != 1:
        raise _refuse(get_context_parallel_world_size())
    return tensor


def slice_with_cp(tokens: torch.Tensor, pad_value: tuple[int, float, Callable]) -> torch.Tensor:
    """This CP rank's share of a sequence: at size 1, all of it (no padding)."""
    if get_context_parallel_world_size() != 1:
        raise _refuse(get_context_parallel_world_size())
    return tokens


def slice_log_prob_with_cp(
    log_prob: list[float] | torch.Tensor,
    total_length: int,
    response_length: int,
) -> list[float] | torch.Tensor:
    """This CP rank's share of a response's log-probs: at size 1, all of them. As in slime, the
    values must be one per response token."""
    if len(log_prob) != response_length:
        raise SlimeError(
            f"log_prob length mismatch: len(log_prob)={len(log_prob)}, response_length={response_length}, "
            f"total_length={total_length}"
        )
    if get_context_parallel_world_size() != 1:
        raise _refuse(get_context_parallel_world_size())
    return log_prob


__all__ = [
    "configure_context_parallel",
    "get_context_parallel_world_size",
    "get_context_parallel_rank",
    "get_logits_and_tokens_offset_with_cp",
    "get_sum_of_sample_mean",
    "all_gather_with_cp",
    "slice_with_cp",
    "slice_log_prob_with_cp",
]
