"""`--offload-train` on CPU: a rank's optimizer state and gradients leave memory while the engines run.

slime (Megatron on GPUs) moves the training actor's GPU memory to the host during rollout. Here the
"device" is the host, so offloading means freeing the memory: every optimizer-state tensor's storage
is written, byte for byte, to an unnamed file under the run directory (`<run-dir>/offload/`, unlinked
at once, so it disappears with the process) and then shrunk to zero bytes; gradients are dropped
(they are None between steps anyway). `onload` grows each storage back and reads its bytes in place, so the tensors keep their identity (the
optimizer, FSDP2's DTensors and the scheduler still point at them) and their values are bit-identical.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from slime.runtime.memory import rss_bytes, trim_heap


def _make_resizable(optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """State read from a checkpoint (`torch.load`) lives in storages that cannot be resized: give
    each such entry a copy of its own (the optimizer finds its state by key, so replacing it is safe)."""
    for opt in optimizers:
        for state in opt.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    local = value.to_local() if hasattr(value, "to_local") else value
                    if local.untyped_storage().nbytes() and not local.untyped_storage().resizable():
                        state[key] = value.clone()


def _state_storages(optimizers: Iterable[torch.optim.Optimizer]) -> list[torch.UntypedStorage]:
    """The distinct storages of every tensor in the optimizers' state (DTensors: their local shard)."""
    seen, out = set(), []
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if not isinstance(value, torch.Tensor):
                    continue
                local = value.to_local() if hasattr(value, "to_local") else value
                storage = local.untyped_storage()
                if storage.nbytes() == 0 or storage.data_ptr() in seen:
                    continue
                seen.add(storage.data_ptr())
                out.append(storage)
    return out


def _bytes_view(storage: torch.UntypedStorage, nbytes: int) -> memoryview:
    """The storage's bytes as a writable buffer (not through numpy, which would make it unresizable)."""
    return memoryview((ctypes.c_char * nbytes).from_address(storage.data_ptr())).cast("B")


class TrainOffload:
    """The offloaded state of one rank: which storages were emptied, and their bytes in an unnamed
    file in `directory` (deleted when closed, or when the process ends: nothing is left behind)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self._held: list[tuple[torch.UntypedStorage, int]] | None = None  # None: in memory
        self._file = None

    @property
    def offloaded(self) -> bool:
        return self._held is not None

    def offload(
        self, optimizers: Iterable[torch.optim.Optimizer], modules: Iterable[torch.nn.Module]
    ) -> dict[str, float]:
        """Drop gradients, write the optimizer state to the file and free it; idempotent."""
        t0, before = time.perf_counter(), rss_bytes()
        if self._held is not None:
            return {}
        for module in modules:
            for p in module.parameters():
                p.grad = None
        optimizers = list(optimizers)
        _make_resizable(optimizers)
        storages = _state_storages(optimizers)
        self.directory.mkdir(parents=True, exist_ok=True)
        held = []
        f = self._file = tempfile.TemporaryFile(dir=self.directory)
        for storage in storages:
            n = storage.nbytes()
            f.write(_bytes_view(storage, n))
            held.append((storage, n))
        f.flush()
        for storage, _ in held:
            storage.resize_(0)
        self._held = held
        trim_heap()
        return {
            "offload_bytes": float(sum(n for _, n in held)),
            "rss_before": float(before),
            "rss_after": float(rss_bytes()),
            "offload_time": time.perf_counter() - t0,
        }

    def onload(self) -> dict[str, float]:
        """Restore every storage from the file, bit for bit, and delete the file; idempotent."""
        t0 = time.perf_counter()
        if self._held is None:
            return {}
        f = self._file
        f.seek(0)
        for storage, n in self._held:
            storage.resize_(n)
            got = f.readinto(_bytes_view(storage, n))
            if got != n:
                raise RuntimeError(f"offloaded optimizer state in {self.directory}: {got} of {n} bytes read back")
        total = sum(n for _, n in self._held)
        self._held, self._file = None, None
        f.close()
        return {"onload_bytes": float(total), "onload_time": time.perf_counter() - t0}
