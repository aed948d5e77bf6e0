"""C libraries of slime-rl, compiled on the machine that uses them: built once, cached.

A source is compiled with the system C compiler (`$CC`, default `gcc`; about a second) into
`$SLIME_KERNEL_CACHE` (default `~/.cache/slime-rl/kernels`) under a name that hashes the source,
the flags, the compiler and this CPU's feature flags, so a change to any of them builds anew and
concurrent builds cannot clash (each writes a temp file, then renames it). Used by the engine's
kernels (slime.engine.kernels, slime.engine.weight_copy) and the MKL vendor shim
(slime.runtime.mkl_vendor).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("SLIME_KERNEL_CACHE") or Path.home() / ".cache" / "slime-rl" / "kernels")


def cpu_info() -> dict[str, str]:
    """`vendor_id`, `model name` and `flags` of the first CPU in /proc/cpuinfo (empty where unreadable)."""
    keys = ("vendor_id", "model name", "flags")
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in keys and key not in info:
                    info[key] = value.strip()
                if len(info) == len(keys):
                    break
    except OSError:
        pass
    return info


def build_library(
    source_path: Path, flags: tuple[str, ...], name: str, cc: str | None = None, libs: tuple[str, ...] = ()
) -> Path:
    """Compile `source_path` into a shared library in the cache (unless a build for this
    source/flags/compiler/CPU is there); returns its path. Raises RuntimeError with the compiler's
    message on failure. Every C file of the engine is built this way."""
    cc = cc or os.environ.get("CC") or "gcc"
    exe = shutil.which(cc)
    if exe is None:
        raise RuntimeError(f"no C compiler {cc!r} on PATH")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    source = source_path.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, " ".join(flags).encode(), "".join(version).encode(), cpu_info().get("flags", "").encode()])
    ).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([exe, *flags, str(source_path), "-o", tmp, *libs], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed to build {source_path.name}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
