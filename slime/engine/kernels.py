"""The native decode step's C kernels (`csrc/decode_kernels.c`): built once, cached, loaded
with ctypes.

The source is compiled with the system C compiler (`$CC`, default `gcc`; about a second) into
`$SLIME_KERNEL_CACHE` (default `~/.cache/slime-rl/kernels`) under a name that hashes the source,
the flags, the compiler and this CPU's feature flags (`-march=native`), so a change to any of
them builds anew and concurrent builds cannot clash (each writes a temp file, then renames it).
Where no compiler works, or with `SLIME_DISABLE_KERNELS=1`, `load()` returns None and the native
forward runs the same steps as torch operations (one log line says why).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import torch

from slime.runtime.c_library import build_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "decode_kernels.c"
FLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-shared",
    "-fPIC",
)

_lock = threading.Lock()
_loaded: DecodeKernels | None = None
_tried = False


def build(cc: str | None = None) -> Path:
    """The decode kernels' shared library (see `build_library`)."""
    return build_library(SOURCE, FLAGS, "decode_kernels", cc, libs=("-lm",))


def load() -> DecodeKernels | None:
    """The kernels, built and loaded once per process; None (logged once) where unavailable."""
    global _loaded, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("SLIME_DISABLE_KERNELS", "") not in ("", "0"):
                logger.info("C decode kernels disabled (SLIME_DISABLE_KERNELS): torch operations instead")
            else:
                try:
                    _loaded = DecodeKernels(ctypes.CDLL(str(build())))
                except (RuntimeError, OSError) as e:
                    logger.warning("C decode kernels unavailable (%s): torch operations instead", e)
        return _loaded


_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


def _ptr(t: torch.Tensor) -> int:
    if t.dtype != torch.float32 and t.dtype != torch.int64:
        raise TypeError(f"kernel arguments are float32/int64 tensors, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError("kernel arguments must be contiguous")
    return t.data_ptr()


class DecodeKernels:
    """Typed wrappers: every tensor is contiguous, float32 (int64 for positions and lengths).
    The caller guarantees the indices: positions inside the cos/sin table, lens[b] < cap (the
    native forward checks both once per step, not per layer)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.add_rms_norm_f32.argtypes = [_P, _P, _P, _P, _I, _I, _F]
        lib.silu_mul_f32.argtypes = [_P, _P, _I]
        lib.rope_store_f32.argtypes = [_P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I]
        lib.decode_attention_f32.argtypes = [_P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _F]
        for fn in (lib.add_rms_norm_f32, lib.silu_mul_f32, lib.rope_store_f32, lib.decode_attention_f32):
            fn.restype = None

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """x += delta (in place, when given); returns RMSNorm(x) * weight (rows of the last dim)."""
        n = x.shape[-1]
        out = torch.empty_like(x)
        self.lib.add_rms_norm_f32(
            _ptr(x), None if delta is None else _ptr(delta), _ptr(weight), _ptr(out), x.numel() // n, n, eps
        )
        return out

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """gate = silu(gate) * up, in place; returns gate."""
        if gate.shape != up.shape:
            raise ValueError(f"silu_mul: shapes {tuple(gate.shape)} and {tuple(up.shape)} differ")
        self.lib.silu_mul_f32(_ptr(gate), _ptr(up), gate.numel())
        return gate

    def rope_store(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> None:
        """Rotate q [B, hq, d] in place; rotate k [B, hk, d] and store it, and v, at position
        positions[b] of slot b of keys [slots, hk, cap / 16, d, 16] / values [slots, hk, cap, d]."""
        b, hq, d = q.shape
        slots, hk, blocks, _, _ = keys.shape
        cap = blocks * 16
        if slots < b or k.shape != (b, hk, d) or v.shape != (b, hk, d) or d > 512:
            raise ValueError(
                f"rope_store: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                f"do not fit keys {tuple(keys.shape)}"
            )
        self.lib.rope_store_f32(
            _ptr(q),
            _ptr(k),
            _ptr(v),
            _ptr(cos),
            _ptr(sin),
            _ptr(positions),
            _ptr(keys),
            _ptr(values),
            b,
            hq,
            hk,
            d,
            cap,
        )

    def decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lens: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """q [B, hk * g, d]; keys [slots >= B, hk, cap / 16, d, 16] (blocks of 16 positions,
        feature-major), values [slots, hk, cap, d] (row b in slot b, positions 0..lens[b]
        visible). Returns [B, hk * g, d]."""
        b, hq, d = q.shape
        slots, hk, blocks, _, block = keys.shape
        cap = blocks * block
        if block != 16 or values.shape[2] != cap:
            raise ValueError(
                f"decode_attention: keys {tuple(keys.shape)} / values {tuple(values.shape)} "
                "are not in blocks of 16 positions"
            )
        if slots < b:
            raise IndexError(f"decode_attention: {b} rows, the KV pool has {slots} slots")
        out = torch.empty_like(q)
        self.lib.decode_attention_f32(
            _ptr(q), _ptr(keys), _ptr(values), _ptr(out), _ptr(lens), b, hk, hq // hk, d, cap, scale
        )
        return out
