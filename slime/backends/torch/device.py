"""Where a training rank computes: its device, its process-group backend, its precision, and
moving its micro-batches there.

* device: one CUDA GPU per rank when torch sees one (the rank's local index, from LOCAL_RANK
  or the global rank, modulo the GPUs visible to the process: under Ray each actor sees only
  its own); the CPU otherwise;
* backend: NCCL for CUDA tensors with gloo for the CPU ones (torch's ``cpu:gloo,cuda:nccl``, so
  the rank's small CPU all-reduces of metrics and denominators keep working), gloo on the CPU;
* ``--bf16`` / ``--fp16``: autocast of the forward/backward on the rank's device, parameters,
  gradients and optimizer state stay fp32 (the master weights).

On the CPU every function here leaves tensors as they are (no copy, no new op), so the CPU path
is exactly what it was before the device was chosen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import torch

from slime.utils.accelerator import cuda_device_count, describe, parse_device

CPU = torch.device("cpu")


def select_device(rank: int = 0, requested: str | None = None, option: str = "device") -> torch.device:
    """The rank's device: `requested` (cpu, cuda, cuda:N; checked against this machine), else
    CUDA when torch sees a GPU, else the CPU. A CUDA device becomes this process's current one."""
    if requested is not None:
        dev = parse_device(requested, option)
    elif cuda_device_count() > 0:
        dev = torch.device("cuda")
    else:
        return CPU
    if dev.type == "cuda":
        if dev.index is None:
            local = int(os.environ.get("LOCAL_RANK", rank))
            dev = torch.device("cuda", local % cuda_device_count())
        torch.cuda.set_device(dev)
    return dev


def process_group_backend(device: torch.device) -> str:
    """gloo on the CPU; NCCL for CUDA tensors plus gloo for CPU ones on a GPU."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def autocast(device: torch.device, bf16: bool, fp16: bool) -> contextlib.AbstractContextManager:
    """Megatron's --bf16 / --fp16 as torch autocast on `device`; neither: fp32 throughout.
    Without autocast's cache of weight casts: FSDP2 gathers a layer's weights into the same
    parameter object at every micro-batch, so a cached cast outlives the gathered weight it came
    from and the later micro-batches' gradients went wrong (2 ranks' grad norm 20% off 1 rank's);
    a cast per micro-batch costs one pass over the weights."""
    if bf16 or fp16:
        return torch.autocast(device.type, dtype=torch.bfloat16 if bf16 else torch.float16, cache_enabled=False)
    return contextlib.nullcontext()


def to_device(mb: Any, device: torch.device) -> Any:
    """A micro-batch (a dataclass of tensors and lists) with its tensors on `device`: the same
    object on the CPU, a copy whose tensors moved otherwise. Loss masks stay where the losses
    are computed (the host)."""
    if device.type == "cpu":
        return mb
    moved = {
        f.name: getattr(mb, f.name).to(device, non_blocking=True)
        for f in dataclasses.fields(mb)
        if isinstance(getattr(mb, f.name), torch.Tensor)
    }
    return dataclasses.replace(mb, **moved)


def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` on the CPU (differentiable); a CPU tensor or None as it is."""
    if t is None or t.device.type == "cpu":
        return t
    return t.cpu()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_metrics(device: torch.device) -> dict[str, float]:
    """The rank's GPU memory for the metrics row (GiB): peak allocated since the last reset,
    allocated and reserved now. Nothing on the CPU (the metrics keep their CPU shape)."""
    if device.type != "cuda":
        return {}
    gib = 1024**3
    return {
        "perf/train_peak_memory_gb": torch.cuda.max_memory_allocated(device) / gib,
        "perf/train_memory_allocated_gb": torch.cuda.memory_allocated(device) / gib,
        "perf/train_memory_reserved_gb": torch.cuda.memory_reserved(device) / gib,
    }


__all__ = [
    "CPU",
    "autocast",
    "describe",
    "memory_metrics",
    "process_group_backend",
    "reset_peak_memory",
    "select_device",
    "to_device",
    "to_host",
]
