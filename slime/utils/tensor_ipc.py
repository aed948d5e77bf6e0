"""Tensors handed to another process on the same machine without copying them through a byte
stream: torch's multiprocessing reductions (`torch.multiprocessing.reductions`), as SGLang's
colocated `update_weights_from_tensor` does.

* a CUDA tensor travels as its CUDA IPC handle (`cudaIpcGetMemHandle` of the caching allocator's
  block); the receiver maps the same GPU memory, so a weight update is a device-to-device copy;
* a CPU tensor travels as the name of a shared-memory segment (torch's `file_system` strategy,
  which works between unrelated processes); it is first copied into shared memory once, so the
  sender's own tensor is never moved.

`dumps` gives the bytes (the engine's `/update_weights_from_tensor` takes them base64-encoded with
`load_format: "torch_ipc"`); `loads` maps them back. Decoding is a restricted unpickler: only
torch's rebuild functions, storage and tensor classes, dtypes and sizes can be named, so a
request cannot make the server call anything else; a CPU tensor's segment and manager socket must
be ones torch made, the socket owned by this user (no path or socket a client chose). The sender must keep its tensors alive until
the receiver has copied them (the engine answers after its copy has finished).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import stat
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as torch_mp  # registers torch's reductions with ForkingPickler
import torch.multiprocessing.reductions as torch_reductions

LOAD_FORMAT = "torch_ipc"

_ALLOWED = {
    "torch.multiprocessing.reductions": {
        "rebuild_tensor",
        "rebuild_cuda_tensor",
        "rebuild_typed_storage",
        "rebuild_storage_empty",
        "rebuild_nested_tensor",
        "rebuild_typed_storage_child",
    },
    "torch.storage": {"UntypedStorage", "TypedStorage"},
    "torch.nn.parameter": {"Parameter"},
    "torch": {"Tensor", "Size", "UntypedStorage", "TypedStorage"},
}


class IPCDecodeError(ValueError):
    """The bytes are not a list of (name, tensor) made by `dumps`."""


@contextlib.contextmanager
def _sharing_strategy(name: str) -> Iterator[None]:
    old = torch_mp.get_sharing_strategy()
    torch_mp.set_sharing_strategy(name)
    try:
        yield
    finally:
        torch_mp.set_sharing_strategy(old)


def shareable(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors `dumps` will send: CUDA tensors as they are (detached), CPU tensors as
    shared-memory copies. Keep the result alive until the receiver has answered."""
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        t = t.detach()
        if t.device.type == "cpu":
            t = t.clone().share_memory_()
        elif t.device.type != "cuda":
            raise ValueError(f"{name!r} is on {t.device}: only cpu and cuda tensors can be shared")
        out[name] = t
    return out


def dumps(named: dict[str, torch.Tensor]) -> bytes:
    """IPC handles of `shareable(named)`'s tensors (pass what `shareable` returned and keep it)."""
    buf = io.BytesIO()
    with _sharing_strategy("file_system"):
        ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump([(str(n), t) for n, t in named.items()])
    return buf.getvalue()


# What torch's file_system strategy names (torch/csrc: libshm): the segment "/torch_<pid>_<random>_<n>"
# and the sender's manager socket ".../torch-shm-dir-XXXXXX/manager.sock". Anything else in a
# payload would make the server open a socket or a file the client chose.
_SEGMENT = re.compile(rb"/torch_\d+_\d+_\d+")
_MANAGER_DIR = re.compile(r"torch-shm-dir-[A-Za-z0-9_]+")


def _rebuild_storage_filename(cls, manager: bytes, handle: bytes, size: int, dtype=None):
    """torch's `rebuild_storage_filename`, for a torch shared-memory segment and a manager socket
    that torch made for a process of this user only."""
    if not isinstance(handle, bytes) or not _SEGMENT.fullmatch(handle):
        raise IPCDecodeError(f"shared-memory name {handle!r} is not one torch gives a tensor")
    path = os.fsdecode(manager) if isinstance(manager, bytes) else ""
    parent = os.path.dirname(path)
    if (
        os.path.basename(path) != "manager.sock"
        or not os.path.isabs(path)
        or os.path.normpath(path) != path
        or not _MANAGER_DIR.fullmatch(os.path.basename(parent))
    ):
        raise IPCDecodeError("the shared-memory manager is not a torch manager socket")
    try:
        st = os.lstat(path)
    except OSError:
        raise IPCDecodeError("the shared-memory manager is not a torch manager socket") from None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise IPCDecodeError("the shared-memory manager is not a torch manager socket")
    return torch_reductions.rebuild_storage_filename(cls, manager, handle, size, dtype)


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch.multiprocessing.reductions" and name == "rebuild_storage_filename":
            return _rebuild_storage_filename
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise IPCDecodeError(f"{module}.{name} is not allowed in a tensor IPC payload")


def loads(data: bytes) -> dict[str, torch.Tensor]:
    """The named tensors of `dumps` bytes, mapped from the sender's memory (no copy yet)."""
    try:
        items = _Restricted(io.BytesIO(data)).load()
    except IPCDecodeError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed payload, whatever the unpickler tripped on
        raise IPCDecodeError(f"not a tensor IPC payload: {type(e).__name__}: {e}") from None
    if not isinstance(items, list) or not all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor) for x in items
    ):
        raise IPCDecodeError("a tensor IPC payload is a list of (name, tensor) pairs")
    return dict(items)
