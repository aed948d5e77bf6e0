"""Weight sync by torch.distributed broadcast (SGLang's `update_weights_from_distributed`).

The trainer (rank 0) and every engine (ranks `rank_offset` ...) form one gloo group of their own,
apart from the trainer's default process group (FSDP), over a TCP store the trainer hosts on
`master_address:master_port`. Everything binds to that address (127.0.0.1 here).

Protocol, as SGLang's:

1. the trainer posts `/init_weights_update_group {master_address, master_port, rank_offset,
   world_size, group_name, backend}` to every engine while it joins the group itself;
2. per update, the trainer posts `/update_weights_from_distributed {names, dtypes, shapes,
   group_name, weight_version, flush_cache}` to every engine and broadcasts the tensors from
   rank 0 in that order; each engine receives them into fresh buffers, then swaps them in
   between batches and answers.

Tensors go in buckets of at most `--update-weight-buffer-size` bytes (one HTTP call each), as
slime's bucketed sync does. The engine-side backend is gloo only (the built-in engine is CPU).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait, FIRST_EXCEPTION
from datetime import timedelta

import torch

from slime.errors import SlimeError

logger = logging.getLogger(__name__)

DEFAULT_GROUP_NAME = "weight_update_group"

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "half": torch.float16, "float64": torch.float64, "double": torch.float64, "int64": torch.int64,
    "int32": torch.int32, "uint8": torch.uint8, "int8": torch.int8, "bool": torch.bool,
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


def create_gloo_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                      timeout_s: float = 60.0):
    """Join a gloo group that lives apart from torch.distributed's default group.

    Rank 0 hosts the TCP store on a socket it binds to `master_address` itself (so it never
    listens on other interfaces); gloo's own connections bind to `master_address` as well.
    Blocks until all `world_size` ranks have joined (or `timeout_s`).
    """
    import torch.distributed as dist

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
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=master_address)]
    return GlooGroup(dist.ProcessGroupGloo(store, rank, world_size, opts), store)


class GlooGroup:
    """A gloo process group plus the store it lives on (kept alive together)."""

    def __init__(self, pg, store):
        self.pg, self._store = pg, store

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        import torch.distributed as dist

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
    import torch.distributed as dist

    kwargs = dict(world_size=world_size, is_master=is_master, timeout=timeout, wait_for_workers=False)
    if fd is not None:
        kwargs["master_listen_fd"] = fd
    try:
        return dist.TCPStore(host, port, use_libuv=False, **kwargs)
    except TypeError:  # older signatures
        return dist.TCPStore(host, port, **kwargs)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def buckets(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Names in order, cut into buckets of at most `max_bytes` (a larger tensor goes alone)."""
    out: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if out[-1] and size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(name)
        size += n
    return out if out[-1] else out[:-1]


class DistributedWeightSync:
    """Trainer side (rank 0 of the group): one group with a fixed set of engines.

    Built lazily on the first update; rebuilt when the engine set changes (an engine removed by
    the router's watcher leaves the group with it).
    """

    def __init__(self, *, master_address: str = "127.0.0.1", group_name: str = DEFAULT_GROUP_NAME,
                 buffer_size: int = 512 * 1024 ** 2, timeout_s: float = 120.0):
        self.master_address = master_address
        self.group_name = group_name
        self.buffer_size = max(1, int(buffer_size))
        self.timeout_s = timeout_s
        self.urls: list[str] = []
        self.pg = None

    # ------------------------------------------------------------------ group
    def connect(self, engine_urls: list[str]) -> None:
        from slime.engine.client import client_for

        self.close()
        urls = list(engine_urls)
        if not urls:
            raise SlimeError("update_weights_from_distributed: no engines to connect to")
        port = free_port(self.master_address)
        world = 1 + len(urls)
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=len(urls))
        try:
            futs = {
                pool.submit(client_for(url).init_weights_update_group, master_address=self.master_address,
                            master_port=port, rank_offset=1 + i, world_size=world, group_name=self.group_name,
                            backend="gloo"): url
                for i, url in enumerate(urls)
            }
            result: dict = {}

            def join():
                try:
                    result["pg"] = create_gloo_group(self.master_address, port, 0, world, self.group_name,
                                                     timeout_s=self.timeout_s)
                except BaseException as e:  # noqa: BLE001
                    result["error"] = e

            joiner = threading.Thread(target=join, name="weight-group-join", daemon=True)
            joiner.start()
            done, _ = wait(list(futs), return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    raise SlimeError(f"init_weights_update_group on {futs[f]} failed: {f.exception()}")
            joiner.join()
        finally:
            pool.shutdown(wait=False)  # never wait for an engine stuck in a failed rendezvous
        if "error" in result:
            raise SlimeError(f"joining weight update group {self.group_name!r} failed: {result['error']}")
        self.pg, self.urls = result["pg"], urls
        logger.info("weight update group %r: trainer + %d engine(s), port %d, %.2fs",
                    self.group_name, len(urls), port, time.perf_counter() - t0)

    def close(self) -> None:
        from slime.engine.client import client_for

        if self.pg is None:
            return
        for url in self.urls:
            try:
                client_for(url).destroy_weights_update_group(self.group_name)
            except Exception as e:  # noqa: BLE001 - an engine that is gone has nothing to destroy
                logger.debug("destroy_weights_update_group on %s: %s", url, e)
        self._drop()

    def _drop(self) -> None:
        pg, self.pg, self.urls = self.pg, None, []
        if pg is not None:
            pg.shutdown()

    # ------------------------------------------------------------------ update
    def push(self, engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str) -> None:
        from slime.engine.client import client_for
        from slime.sync.tensor import dedupe_tied

        if self.pg is None or list(engine_urls) != self.urls:
            self.connect(engine_urls)
        tensors = dedupe_tied(state)
        groups = buckets(tensors, self.buffer_size)
        pool = ThreadPoolExecutor(max_workers=len(self.urls) + 1)
        try:
            for b, names in enumerate(groups):
                last = b == len(groups) - 1
                meta = dict(names=names, dtypes=[dtype_name(tensors[n].dtype) for n in names],
                            shapes=[list(tensors[n].shape) for n in names], group_name=self.group_name,
                            flush_cache=True, weight_version=weight_version if last else None)
                posts = {pool.submit(client_for(url).update_weights_from_distributed, **meta): url
                         for url in self.urls}

                def send(names=names, pg=self.pg):
                    for n in names:
                        pg.broadcast(tensors[n])

                sender = pool.submit(send)
                # returns when every call is done, or at the first that failed
                done, _ = wait([sender, *posts], return_when=FIRST_EXCEPTION)
                for f in done:
                    if f.exception() is not None:
                        # The group may be half-way through a broadcast: never reuse it.
                        self._drop()
                        where = posts.get(f, "the trainer's broadcast")
                        raise SlimeError(f"update_weights_from_distributed ({where}) failed: {f.exception()}")
        finally:
            pool.shutdown(wait=False)
