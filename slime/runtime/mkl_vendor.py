"""Intel MKL's CPU-vendor check, and the one-function shim that lifts it on other vendors' CPUs.

torch's CPU build does its fp32 matrix products (`aten::mm`/`addmm`/`bmm`: every linear layer,
forward and backward) in Intel MKL. MKL checks the CPU's vendor before its instruction sets: on a
CPU that is not Intel's it runs a generic AVX2 path, even where the CPU has AVX-512 (AMD Zen 4 and
5). Measured on this project's 2-core AMD EPYC (Zen 5, 2.6 GHz): a [2048 x 512] x [512 x 1536] fp32
product ran at ~80 GFLOP/s on one thread, ~190 with the shim; the ~25M model's training step 1.8x
faster, the engine's decode 1.5x (`bench/mkl_vendor.py`).

MKL asks one internal function, `mkl_serv_intel_cpu_true`, whether the CPU is Intel's. The shim
(`csrc/mkl_vendor_shim.c`) defines it to answer yes; preloaded (`LD_PRELOAD`) into a process, MKL
then chooses its kernels by the instruction sets the CPU reports, as on an Intel CPU.

It applies only where it can help and is known to work: Linux on x86-64, a CPU whose vendor is not
Intel and that has AVX2 and FMA, a torch built with MKL, and `--mkl-vendor-shim` (on by default;
`SLIME_MKL_VENDOR_SHIM=0` turns it off for every process). Before the first use on a machine, a
subprocess with the shim preloaded checks an fp32 product against float64 (a wrong kernel choice
would show there, or crash that subprocess rather than the run); a pass is cached beside the built
library (whose name hashes the CPU's flags), per torch version. It is given to the processes that
run the model: the Ray workers of a local cluster (trainer, rollout manager, engine actors) through
their environment, and the built-in engine servers (`slime serve` starts itself again with it). The
driver, graders and sandboxes do not get it.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path

from slime.runtime.c_library import build_library, cpu_info

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "mkl_vendor_shim.c"
ENV_SWITCH = "SLIME_MKL_VENDOR_SHIM"
_REEXEC_MARK = "SLIME_MKL_VENDOR_SHIM_REEXEC"  # set by the second start of a command (reexec_with_shim)
_UNSET = object()
_lock = threading.Lock()
_shim: str | None | object = _UNSET  # this process's answer of shim_library, once asked

# Run in a subprocess with the shim preloaded: an fp32 product (MKL's sgemm) against float64.
_CHECK = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
a, b = torch.randn(300, 257), torch.randn(257, 190)
err = (a @ b - (a.double() @ b.double()).float()).abs().max().item()
print("ok" if err < 1e-3 else f"mismatch {err}")
"""


def not_applicable(info: dict[str, str] | None = None) -> str | None:
    """Why the shim does not apply on this machine (None: it does)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV_SWITCH}=0"
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"not Linux on x86-64 ({sys.platform}, {platform.machine()})"
    info = cpu_info() if info is None else info
    vendor = info.get("vendor_id", "")
    if not vendor or vendor == "GenuineIntel":
        return f"CPU vendor {vendor or 'unknown'} (MKL's own vendor)"
    flags = set(info.get("flags", "").split())
    if not {"avx2", "fma"} <= flags:
        return f"{vendor} CPU without AVX2/FMA"
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "torch is not installed"
    if not torch.backends.mkl.is_available():
        return "torch is not built with MKL"
    return None


def shim_library() -> str | None:
    """The built and checked shim's path for this machine, or None (logged once: why not)."""
    global _shim
    with _lock:
        if _shim is _UNSET:
            _shim = _build_and_check()
        return _shim


def _build_and_check() -> str | None:
    why = not_applicable()
    if why is not None:
        logger.debug("MKL vendor shim not used: %s", why)
        return None
    try:
        path = build_library(SOURCE, ("-O2", "-shared", "-fPIC"), "mkl_vendor_shim")
    except RuntimeError as e:
        logger.warning("MKL vendor shim not built (%s): matrix products use MKL's path for this CPU's vendor", e)
        return None
    import torch

    verdict = path.with_name(f"{path.stem}-torch-{torch.__version__}.checked")
    if not verdict.exists():
        env = {**os.environ, **_ld_preload(str(path)), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        try:
            proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=120)
            result = proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-500:]}"
        except subprocess.TimeoutExpired:
            result = "timed out"
        if result != "ok":
            logger.warning("MKL vendor shim failed its check (%s): not used", result)
            return None
        verdict.write_text("ok\n")
    return str(path)


def _ld_preload(path: str) -> dict[str, str]:
    """`LD_PRELOAD` with `path` first, then what this process's environment preloads (once each)."""
    rest = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    return {"LD_PRELOAD": " ".join([path] + [p for p in rest if p != path])}


def preload_env(enabled: bool = True) -> dict[str, str]:
    """The environment variables that preload the shim into a child process (`LD_PRELOAD`,
    keeping what this process's environment already preloads), or {} where it does not apply."""
    if not enabled:
        return {}
    path = shim_library()
    return {} if path is None else _ld_preload(path)


def loaded(pid: int | str = "self") -> bool:
    """Whether the shim is mapped into process `pid` (its /proc maps)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any("mkl_vendor_shim" in line for line in f)
    except OSError:
        return False


def reexec_with_shim() -> None:
    """Start this command again with the shim preloaded (`slime serve`, `python -m
    slime.engine.server` by hand), unless it is loaded already or does not apply. The environment
    marks the second start, so a shim that does not load cannot make it loop."""
    if loaded() or os.environ.get(_REEXEC_MARK):
        return
    env = preload_env()
    if not env:
        return
    os.environ[_REEXEC_MARK] = "1"
    os.environ.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
