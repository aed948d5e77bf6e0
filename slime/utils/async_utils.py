"""One long-lived asyncio loop per process, so HTTP clients and semaphores survive across rollouts
(slime's `slime.utils.async_utils`: `AsyncLoopThread`, `get_async_loop`, `run`).

Sync code (a Ray actor method, a rollout function called by slime's contract) calls
`run(coro)`; the coroutine runs on a background thread's loop and the caller blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from slime.utils.http_utils import close_sessions

__all__ = ["AsyncLoopThread", "get_async_loop", "get_loop", "run"]

T = TypeVar("T")


class AsyncLoopThread:
    """An event loop running forever on a daemon thread; `run(coro)` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._start_loop, name="slime-async", daemon=True)
        self._thread.start()

    def _start_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # blocking here would wait for ourselves forever
            coro.close()
            raise RuntimeError("slime.utils.async_utils.run() called from inside its own loop; await instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_async_loop: AsyncLoopThread | None = None
_lock = threading.Lock()


def get_async_loop() -> AsyncLoopThread:
    """The process's one `AsyncLoopThread` (started on first use)."""
    global _async_loop
    with _lock:
        if _async_loop is None or _async_loop.loop.is_closed():
            _async_loop = AsyncLoopThread()
            atexit.register(_close_http_sessions, _async_loop.loop)
        return _async_loop


def get_loop() -> asyncio.AbstractEventLoop:
    """The background loop itself."""
    return get_async_loop().loop


def _close_http_sessions(loop: asyncio.AbstractEventLoop) -> None:
    """At exit, close the loop's shared HTTP session (no "Unclosed client session" noise)."""
    if loop.is_closed() or not loop.is_running():
        return
    try:
        asyncio.run_coroutine_threadsafe(close_sessions(), loop).result(timeout=2)
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the process's background loop and wait for its result."""
    return get_async_loop().run(coro)
