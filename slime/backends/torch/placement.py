"""A training rank's cores: the placement's share it is pinned to, and the idle engines' cores it
may borrow during a train call (CPU only; `slime.runtime.core_lending`)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray
import torch

from slime.runtime.core_lending import CoreBorrower, Lender
from slime.runtime.cores import pin_to_cores


class RankCores:
    def __init__(self) -> None:
        self.own_cores: tuple[int, ...] = ()  # the placement's share (`pin`)
        self.lenders: list[Lender] = []  # engines whose cores this rank may borrow while they idle
        self.borrower: CoreBorrower | None = None

    def pin(self, cores: list[int] | None, num_threads: int, lenders: list[Lender] | None = None) -> dict[str, Any]:
        """Bind this process to its placement's cores (before the model loads, so its threads follow)."""
        self.own_cores = tuple(cores or ())
        self.lenders = list(lenders or [])
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "cores": list(pin_to_cores(cores)),
            "threads": num_threads,
        }

    def install(self, model: torch.nn.Module, num_threads: int, device: torch.device) -> None:
        """Borrow the lenders' idle cores at the model's check points (on the CPU, with cores of its own)."""
        if self.lenders and self.own_cores and device.type == "cpu":
            self.borrower = CoreBorrower(self.own_cores, num_threads, self.lenders)
            self.borrower.install(model)

    def borrowing(self) -> contextlib.AbstractContextManager:
        """Around a train call: idle cores may be borrowed inside, all are given back at the end."""
        return self.borrower.borrowing() if self.borrower is not None else contextlib.nullcontext()

    def take_metrics(self) -> dict[str, float]:
        return self.borrower.take_metrics() if self.borrower is not None else {}
