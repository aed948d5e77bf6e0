"""The weight-update group both sides of `update_weights_from_distributed` join (SGLang's protocol).

The trainer (rank 0) and every engine (ranks `rank_offset` ...) form one gloo group of their own,
apart from the trainer's default process group (FSDP), over a TCP store the trainer hosts on
`master_address:master_port`. Everything binds to that address (127.0.0.1 here). The engine's
`/init_weights_update_group` joins it; the trainer side (`slime.sync.distributed`) drives it.
Tensors travel with their dtype named as a string (`dtype_name` / `parse_dtype`).
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_GROUP_NAME = "weight_update_group"

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "double": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: object) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16; ValueError names the bad value."""
    if isinstance(name, str):
        d = _DTYPES.get(name.removeprefix("torch."))
        if d is not None:
            return d
    raise ValueError(f"unknown dtype {name!r} (expected e.g. 'float32' or 'bfloat16')")


def create_gloo_group(
    master_address: str, master_port: int, rank: int, world_size: int, group_name: str, timeout_s: float = 60.0
):
    """Join a gloo group that lives apart from torch.distributed's default group.

    Rank 0 hosts the TCP store on a socket it binds to `master_address` itself (so it never
    listens on other interfaces); gloo's own connections bind to `master_address` as well.
    Blocks until all `world_size` ranks have joined (or `timeout_s`).
    """
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((master_address, master_port))
        listen.listen(max(8, world_size * 2))
        store = _tcp_store(master_address, master_port, world_size, True, timeout, listen.fileno())
        listen.detach()  # the store's daemon owns the fd now; Python must never close it under it
    else:
        store = _tcp_store(master_address, master_port, world_size, False, timeout, None)
    store = dist.PrefixStore(f"slime/{group_name}", store)
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's own private options type
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=master_address)]
    return GlooGroup(dist.ProcessGroupGloo(store, rank, world_size, opts), store)


class GlooGroup:
    """A gloo process group plus the store it lives on (kept alive together)."""

    def __init__(self, pg, store):
        self.pg, self._store = pg, store

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def shutdown(self) -> None:
        try:
            self.pg.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass
        self._store = None


def _tcp_store(host, port, world_size, is_master, timeout, fd):
    kwargs = dict(world_size=world_size, is_master=is_master, timeout=timeout, wait_for_workers=False)
    if fd is not None:
        kwargs["master_listen_fd"] = fd
    try:
        return dist.TCPStore(host, port, use_libuv=False, **kwargs)
    except TypeError:  # older signatures
        return dist.TCPStore(host, port, **kwargs)
