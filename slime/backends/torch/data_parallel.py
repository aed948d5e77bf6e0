"""Which share of a rollout a training rank trains on.

With the FSDP backend every rank is its own data-parallel rank. With tensor parallelism (the
megatron backend) the ranks that hold one model copy between them train on the same samples: they
share a data-parallel rank, and sums over "the ranks" (token counts, whitening statistics) run over
the data-parallel group only, so no sample counts twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DataParallel:
    rank: int
    size: int
    group: Any = None  # a torch.distributed group; None: the default one (every rank)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the data-parallel ranks (a new tensor; `t` itself when there is one)."""
        if self.size > 1:
            t = t.clone()
            dist.all_reduce(t, group=self.group)
        return t
