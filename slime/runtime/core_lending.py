"""Idle cores lent to the trainer (CPU runs where trainer and engines have cores of their own).

Disaggregated on one machine, the trainer and an engine are pinned to disjoint shares of the cores
(`slime.ray.placement_group`), so neither can slow the other down. But each side is idle part of the
time: with `train_async` on a model whose training step is longer than its rollout, the engine's
cores sit idle for the rest of the step while the trainer runs on its own share alone.

So an engine *lends* its cores while it has nothing to run, and the trainer *borrows* them:

* the engine's scheduler marks itself idle when its queue empties and busy before it runs again
  (one byte in a small shared file per engine, `EngineLending`);
* the trainer reads those bytes at check points inside its step (before each decoder layer's
  forward and after its backward: a fraction of a step apart) and, when that changes the set of
  cores it may use, re-pins itself and sets its torch thread count to match (`CoreBorrower`);
* at the end of each train call it gives everything back.

Only the trainer's compute thread changes its thread count (OpenMP's count is per calling thread),
and it is the thread that runs the check points. An engine that becomes busy while its cores are
lent competes with the trainer for at most one check-point interval; in the loops' order that
hardly happens, because an engine gets new work after a weight sync, when the trainer has given
its cores back.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slime.runtime.cores import pin_to_cores

IDLE, BUSY = b"\x01", b"\x00"
ENV_LEND_FILE = "SLIME_LEND_CORES_FILE"  # the launcher names an engine's file here


def lending_file(run_dir: str, engine_rank: int) -> str:
    """Where engine `engine_rank` says whether it is idle. In the run directory: both processes
    run on one node and see the same file; a stale one from an earlier run is reset (busy) by the
    engine when it starts."""
    return os.path.join(run_dir, "cores", f"engine_{engine_rank}.idle")


def _map(path: str) -> mmap.mmap:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < 1:
            os.ftruncate(fd, 1)
        return mmap.mmap(fd, 1)
    finally:
        os.close(fd)


class EngineLending:
    """The engine's side: `idle()` when it has nothing to run, `busy()` before it runs anything."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map = _map(path)
        self._state = None
        self.busy()

    def idle(self) -> None:
        if self._state != IDLE:
            self._map[0:1] = self._state = IDLE

    def busy(self) -> None:
        if self._state != BUSY:
            self._map[0:1] = self._state = BUSY

    @classmethod
    def from_env(cls) -> EngineLending | None:
        """The file the launcher named in `SLIME_LEND_CORES_FILE` (None: this engine lends nothing)."""
        path = os.environ.get(ENV_LEND_FILE)
        return cls(path) if path else None


@dataclass
class Lender:
    """One engine whose cores a trainer rank may borrow."""

    path: str
    cores: tuple[int, ...]


@dataclass
class CoreBorrower:
    """The trainer rank's side. `own`: its pinned cores; `threads`: its thread count on them."""

    own: tuple[int, ...]
    threads: int
    lenders: list[Lender]
    _maps: list[mmap.mmap] = field(init=False, repr=False)
    _using: tuple[int, ...] = field(init=False)  # the cores it is pinned to now
    borrowed_checks: int = field(default=0, init=False)  # check points run on borrowed cores (a metric)
    checks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._maps = [_map(lender.path) for lender in self.lenders]
        self._using = tuple(self.own)

    @contextlib.contextmanager
    def borrowing(self) -> Iterator[None]:
        """One train call: idle engines' cores from its first check point on, all given back at its
        end (before the weight sync: the engines run next), even when it fails."""
        self.check()
        try:
            yield
        finally:
            self.give_back()

    def check(self) -> None:
        """At a check point: use the own cores plus those of every idle lender."""
        cores = tuple(self.own) + tuple(
            c for m, lender in zip(self._maps, self.lenders, strict=True) if m[0:1] == IDLE for c in lender.cores
        )
        self.checks += 1
        if len(cores) > len(self.own):
            self.borrowed_checks += 1
        if cores != self._using:
            self._apply(cores)

    def give_back(self) -> None:
        if self._using != tuple(self.own):
            self._apply(tuple(self.own))

    def _apply(self, cores: tuple[int, ...]) -> None:
        pin_to_cores(cores)
        # threads grow with the cores: own threads plus one per borrowed core
        torch.set_num_threads(self.threads + len(cores) - len(self.own))
        self._using = cores

    def take_metrics(self) -> dict[str, float]:
        """The share of this call's check points that ran on borrowed cores; resets the counts."""
        share = self.borrowed_checks / self.checks if self.checks else 0.0
        self.borrowed_checks = self.checks = 0
        return {"perf/borrowed_cores_share": share}

    def install(self, model: torch.nn.Module) -> int:
        """Check points around every decoder layer of `model`: before its forward, and when the
        gradient of its input arrives (its backward is done). Returns how many layers got them."""
        layers = decoder_layers(model)
        for layer in layers:
            layer.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        return len(layers)

    def _before_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self.check()
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(self._after_backward)

    def _after_backward(self, grad: torch.Tensor) -> None:
        self.check()


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (`model.model.layers` and the like): the
    first ModuleList of more than one module, in module order."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            return list(module)
    return []
