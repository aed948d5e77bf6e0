"""What this machine's devices can do: the facts the trainer, the engine and the start-up checks
share (ground layer: the engine and the arguments read them, the trainer picks its device from them).

Nothing here allocates on a GPU; every fact is read from torch, so a CPU-only machine answers
at once. Device names are torch's (`cpu`, `cuda`, `cuda:N`).
"""

from __future__ import annotations

import torch

from slime.errors import SlimeError

GIB = 1024**3


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def cuda_device_count() -> int:
    return int(torch.cuda.device_count()) if cuda_available() else 0


def cpu_has_bf16_instructions() -> bool:
    """AVX512-BF16 or AMX: bf16 matrix products at full speed (elsewhere torch converts to fp32)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch build without these probes (not x86)
        return False


def cpu_can_compute_bf16() -> bool:
    """Whether this torch build computes a bf16 matrix product on this CPU at all (natively or
    by converting to fp32); a build or CPU without it raises."""
    try:
        a = torch.ones((2, 2), dtype=torch.bfloat16)
        return bool(torch.equal(a @ a, torch.full((2, 2), 2.0, dtype=torch.bfloat16)))
    except RuntimeError:
        return False


def parse_device(name: str, option: str) -> torch.device:
    """`name` as a torch device of a kind this project runs on (cpu, cuda, cuda:N); SlimeError
    naming `option` otherwise, and for a CUDA device this machine does not have."""
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise SlimeError(f"{option} {name!r}: not a device name (cpu, cuda or cuda:N)") from e
    if dev.type not in ("cpu", "cuda"):
        raise SlimeError(f"{option} {name!r}: only cpu and cuda devices are supported")
    if dev.type == "cuda":
        count = cuda_device_count()
        if count == 0:
            raise SlimeError(
                f"{option} {name}: this machine has no CUDA GPU that torch can use "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
            )
        if dev.index is not None and dev.index >= count:
            raise SlimeError(f"{option} {name}: this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    return dev


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return cpu_can_compute_bf16()


def describe(device: torch.device) -> str:
    """One phrase naming the device and what it has (for error messages and logs)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        return f"cuda:{index} ({p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / GIB:.1f} GiB)"
    bf16 = "bf16 instructions" if cpu_has_bf16_instructions() else "no bf16 instructions (torch converts to fp32)"
    return f"cpu ({bf16})"


def check_bf16(device: torch.device, option: str = "--bf16") -> None:
    """SlimeError naming `option` and the device when bf16 cannot be computed there."""
    if not bf16_supported(device):
        raise SlimeError(
            f"{option}: {describe(device)} cannot compute in bfloat16; drop {option} "
            f"(fp32 training) or run on a device with bf16"
        )


def total_memory_bytes(device: torch.device) -> int:
    """The device's memory: a GPU's total, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def free_memory_bytes(device: torch.device) -> int:
    """What is free on the GPU now (other processes' use subtracted); the CPU: MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return total_memory_bytes(device)
