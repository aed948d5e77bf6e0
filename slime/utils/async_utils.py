"""One long-lived asyncio loop per process, so HTTP clients and semaphores survive across rollouts.

Sync code (a Ray actor method, a rollout function called by slime's contract) calls
`run(coro)`; the coroutine runs on a background thread's loop and the caller blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any, Coroutine, TypeVar

from slime.utils.http_utils import close_sessions

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="slime-async", daemon=True).start()
            atexit.register(_close_http_sessions, _loop)
        return _loop


def _close_http_sessions(loop: asyncio.AbstractEventLoop) -> None:
    """At exit, close the loop's shared HTTP session (no "Unclosed client session" noise)."""
    if loop.is_closed() or not loop.is_running():
        return
    try:
        asyncio.run_coroutine_threadsafe(close_sessions(), loop).result(timeout=2)
    except Exception:
        pass


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the process's background loop and wait for its result."""
    loop = get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError("slime.utils.async_utils.run() called from inside its own loop; await instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
