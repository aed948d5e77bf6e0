"""Weight loads into the engine's model: `copy_into(dst, src)`.

The engine keeps each linear weight column-major (`model_runner.column_major_linears`), so a
weight update from row-major tensors is a transposing copy; torch's strided `copy_` does it at
a fraction of memory speed, which made it most of a colocated weight sync. For float32 the copy
runs in a small C kernel (`csrc/weight_copy.c`, 8x8 register transposes in 64x64 tiles, on
the engine's torch threads), built
and cached as the decode kernels are (`slime.engine.kernels`; `SLIME_DISABLE_KERNELS=1` or no
compiler: torch's copy). Everything else is `dst.copy_(src)`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import torch

from slime.engine import kernels

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "weight_copy.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")

_lock = threading.Lock()
_lib = None
_tried = False


def _load():
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("SLIME_DISABLE_KERNELS", "") not in ("", "0"):
                return None
            try:
                lib = ctypes.CDLL(str(kernels.build_library(SOURCE, FLAGS, "weight_copy")))
                lib.transpose_copy_32.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 5
                lib.transpose_copy_32.restype = None
                _lib = lib
            except (RuntimeError, OSError) as e:
                logger.warning("C weight-copy kernel unavailable (%s): torch's copy instead", e)
        return _lib


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src), the transposing float32 case in C."""
    if (
        dst.dim() == 2
        and dst.dtype == torch.float32
        and src.dtype == torch.float32
        and dst.device.type == "cpu"
        and src.device.type == "cpu"
        and src.is_contiguous()
        and not dst.is_contiguous()
        and dst.t().is_contiguous()
        and dst.shape == src.shape
        and dst.numel() >= 4096
    ):
        lib = _load()
        if lib is not None:
            rows, cols = src.shape
            lib.transpose_copy_32(src.data_ptr(), dst.data_ptr(), rows, cols, cols, rows, torch.get_num_threads())
            return
    dst.copy_(src)
