"""W = W0 + scale·B·A: the one LoRA merge both sides compute, so that an engine merging an
adapter it received gets the very bits the trainer's merge gets.

The product runs on one thread: a multi-threaded BLAS may split the sum differently with another
thread count (the trainer and the engine run with their own), and a LoRA product is small (rank
r inner dimension), so one thread costs little. On one CPU type the result is then bit-identical
in every process; across CPU types with other vector units it may differ in the last bit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_threads_lock = threading.Lock()  # set_num_threads is process-wide: one merge at a time changes it


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    with _threads_lock:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def merge_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """`base + scale·(b @ a)` in float32 arithmetic (a: [r, in], b: [out, r]), in the wider of the
    base's and the adapter's dtypes: a base kept in bf16 (a `--bf16` LoRA trainer's) with an fp32
    adapter gives fp32 weights, the same on both sides.
    One fused GEMM (`addmm`): 4x faster than product, scale and sum as separate passes. A loop of
    merges runs inside one `one_thread()` (switching thread counts per weight costs more than the
    merge of a small one)."""
    if torch.get_num_threads() != 1:
        with one_thread():
            return merge_weight(base, a, b, scale)
    return torch.addmm(base.float(), b.float(), a.float(), alpha=scale).to(torch.promote_types(base.dtype, a.dtype))


def check_shapes(name: str, base: torch.Size, a: torch.Size, b: torch.Size) -> str | None:
    """What is wrong with an adapter's shapes for a weight of shape `base` (None: they fit)."""
    if len(base) != 2 or len(a) != 2 or len(b) != 2:
        return f"{name}: LoRA needs 2-d weights, got base {tuple(base)}, A {tuple(a)}, B {tuple(b)}"
    if a[0] != b[1] or b[0] != base[0] or a[1] != base[1]:
        return (
            f"{name}: A {tuple(a)} and B {tuple(b)} do not fit a weight of shape {tuple(base)} "
            "(expected A [r, in], B [out, r])"
        )
    return None
