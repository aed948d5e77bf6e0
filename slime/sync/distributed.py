"""Weight sync by torch.distributed broadcast (SGLang's `update_weights_from_distributed`).

The trainer (rank 0) and every engine (ranks `rank_offset` ...) form one gloo group of their own
(`slime.engine.weight_group`), apart from the trainer's default process group (FSDP).

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
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import torch

from slime.engine.client import client_for
from slime.engine.weight_group import DEFAULT_GROUP_NAME, create_gloo_group, dtype_name
from slime.errors import SlimeError
from slime.sync.tensor import dedupe_tied
from slime.utils.net import free_port

logger = logging.getLogger(__name__)


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

    def __init__(
        self,
        *,
        master_address: str = "127.0.0.1",
        group_name: str = DEFAULT_GROUP_NAME,
        buffer_size: int = 512 * 1024**2,
        timeout_s: float = 120.0,
    ):
        self.master_address = master_address
        self.group_name = group_name
        self.buffer_size = max(1, int(buffer_size))
        self.timeout_s = timeout_s
        self.urls: list[str] = []
        self.pg = None

    # ------------------------------------------------------------------ group
    def connect(self, engine_urls: list[str]) -> None:
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
                pool.submit(
                    client_for(url).init_weights_update_group,
                    master_address=self.master_address,
                    master_port=port,
                    rank_offset=1 + i,
                    world_size=world,
                    group_name=self.group_name,
                    backend="gloo",
                ): url
                for i, url in enumerate(urls)
            }
            result: dict = {}

            def join():
                try:
                    result["pg"] = create_gloo_group(
                        self.master_address, port, 0, world, self.group_name, timeout_s=self.timeout_s
                    )
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
        logger.info(
            "weight update group %r: trainer + %d engine(s), port %d, %.2fs",
            self.group_name,
            len(urls),
            port,
            time.perf_counter() - t0,
        )

    def close(self) -> None:
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
    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str, lora: dict | None = None
    ) -> int:
        """Broadcast `state` to every engine; the bytes sent. `lora`: the update is a LoRA adapter
        (`slime.engine.lora_weights`), announced on every bucket."""
        if self.pg is None or list(engine_urls) != self.urls:
            self.connect(engine_urls)
        tensors = dedupe_tied(state)
        groups = buckets(tensors, self.buffer_size)
        pool = ThreadPoolExecutor(max_workers=len(self.urls) + 1)
        try:
            for b, names in enumerate(groups):
                last = b == len(groups) - 1
                meta: dict[str, Any] = dict(
                    names=names,
                    dtypes=[dtype_name(tensors[n].dtype) for n in names],
                    shapes=[list(tensors[n].shape) for n in names],
                    group_name=self.group_name,
                    flush_cache=True,
                    weight_version=weight_version if last else None,
                )
                if lora is not None:
                    meta["lora"] = lora
                posts = {pool.submit(client_for(url).update_weights_from_distributed, **meta): url for url in self.urls}

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
        return sum(t.numel() * t.element_size() for t in tensors.values())
