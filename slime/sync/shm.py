"""Colocated weight sync on the CPU through shared memory (the CPU counterpart of SGLang's CUDA
IPC handles): the trainer writes every weight once into a file under /dev/shm that the engines
map; `/update_weights_from_shared_memory` carries only the layout (names, dtypes, shapes,
offsets). No serialisation, no bytes over HTTP; the engine copies from the mapping into its
model between batches (it is paused only for that copy).

The buffer is kept between syncs (the engines keep their mapping too) and replaced only when the
layout changes; it is removed by `close()`, and a buffer left by a process that died is removed
by the next one that allocates.
"""

from __future__ import annotations

import atexit
import logging
import mmap
import os
import re
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

from slime.engine.client import client_for
from slime.engine.weight_group import dtype_name
from slime.sync.tensor import dedupe_tied

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SHM_PREFIX = "slime-weights-"
ALIGN = 64
_BUFFER = re.compile(re.escape(SHM_PREFIX) + r"(\d+)-[0-9a-f]+")  # <prefix><writer pid>-<random>


def plan(tensors: dict[str, torch.Tensor]) -> tuple[list[tuple[str, torch.dtype, list[int], int]], int]:
    """[(name, dtype, shape, byte offset)] with every tensor 64-byte aligned, and the total size."""
    out, off = [], 0
    for name, t in tensors.items():
        out.append((name, t.dtype, list(t.shape), off))
        off += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return out, max(off, ALIGN)


_LIVE: set[str] = set()  # this process's buffers, unlinked at exit if close() was not called


@atexit.register
def _unlink_live() -> None:
    for path in list(_LIVE):
        try:
            os.unlink(path)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    """A process that exists and has not exited (a zombie's buffer is stale too)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def buffers() -> set[str]:
    """The weight buffers under /dev/shm now (any process's)."""
    try:
        return {n for n in os.listdir(SHM_DIR) if _BUFFER.fullmatch(n)}
    except OSError:
        return set()


def remove_stale_buffers(among: set[str] | None = None, wait_s: float = 0.0) -> None:
    """Remove the buffers whose writer is gone (a trainer killed before close()). `among`: only these
    (a run's own, when it ends); `wait_s`: first give their writers that long to exit (a rank that
    was just killed may take a moment), polling."""
    names = buffers() if among is None else among
    deadline = time.monotonic() + wait_s
    while True:
        left = set()
        for name in names:
            m = _BUFFER.fullmatch(name)
            if m and not _alive(int(m.group(1))):
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except OSError:
                    pass
            elif m and os.path.exists(os.path.join(SHM_DIR, name)):
                left.add(name)
        if not left or time.monotonic() >= deadline:
            return
        names = left
        time.sleep(0.1)


class SharedMemoryWeightSync:
    def __init__(self) -> None:
        self.path: str | None = None
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        self._layout: list | None = None
        self._size = 0

    @staticmethod
    def available() -> bool:
        return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)

    def _allocate(self, size: int) -> None:
        self.close()
        remove_stale_buffers()
        path = os.path.join(SHM_DIR, f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.path, self._size = path, size
        _LIVE.add(path)

    def write(self, state: dict[str, torch.Tensor]) -> dict:
        """Copy `state` (tied weights once) into the buffer; returns the control message's body."""
        tensors = dedupe_tied(state)
        layout, size = plan(tensors)
        if self._bytes is None or layout != self._layout:
            self._allocate(size)
            self._layout = layout
        buf = self._bytes
        assert buf is not None, "allocated above"
        for name, dt, shape, off in layout:
            t = tensors[name]
            n = t.numel() * t.element_size()
            buf[off : off + n].view(dt).view(shape).copy_(t)
        return {
            "path": self.path,
            "size": self._size,
            "names": [n for n, *_ in layout],
            "dtypes": [dtype_name(dt) for _, dt, _, _ in layout],
            "shapes": [s for _, _, s, _ in layout],
            "offsets": [o for *_, o in layout],
        }

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str, lora: dict | None = None
    ) -> int:
        """Write once, then every engine loads from the same buffer. Returns the bytes written.
        `lora`: the update is a LoRA adapter (`slime.engine.lora_weights`)."""
        body = self.write(state)
        body.update(weight_version=weight_version, flush_cache=True)
        if lora is not None:
            body["lora"] = lora

        def one(url: str) -> None:
            client_for(url)._call("POST", "/update_weights_from_shared_memory", body)

        if len(engine_urls) == 1:
            one(engine_urls[0])
        else:
            with ThreadPoolExecutor(max_workers=len(engine_urls)) as pool:
                list(pool.map(one, engine_urls))
        return self._size

    def close(self) -> None:
        self._bytes = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still alive: the mapping goes with it
                pass
            self._map = None
        if self.path is not None:
            _LIVE.discard(self.path)
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None
        self._layout = None

    def __del__(self) -> None:
        try:
            self.close()
        except BaseException:  # noqa: BLE001 - interpreter shutdown, or a SystemExit raised while closing
            pass
