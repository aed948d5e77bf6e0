"""Wall-clock timers that record ``perf/<name>_time`` (seconds) into a metrics dict.

store = {}
with timer("rollout", store):
    ...
store  # {"perf/rollout_time": 1.23}

`inverse_timer(name)` pauses the running timer of that name for a block (slime's: a wait inside
a timed phase that should not count towards it); `with_defer(fn)` runs `fn` after the decorated
function, whether it returns or raises.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from slime.errors import SlimeError

__all__ = ["Timer", "timer", "metric_key", "inverse_timer", "with_defer"]

# the timers inside their block, by name: what inverse_timer pauses
_running: dict[str, Timer] = {}
_running_lock = threading.Lock()


def metric_key(name: str) -> str:
    """``"rollout"`` -> ``"perf/rollout_time"`` (slime's key for a timed phase)."""
    return f"perf/{name}_time"


class Timer:
    """Context manager timing a block with ``time.perf_counter``.

    On exit (also when the block raises) ``elapsed`` holds the seconds, and if ``store`` is given
    ``store["perf/<name>_time"]`` is set to it (``accumulate=True`` adds to an existing value, for
    a phase timed in several pieces).
    """

    def __init__(self, name: str, store: dict[str, Any] | None = None, *, accumulate: bool = False) -> None:
        self.name = name
        self.store = store
        self.accumulate = accumulate
        self.key = metric_key(name)
        self.elapsed: float | None = None
        self._start: float | None = None
        self._paused_at: float | None = None
        self._paused_s = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        self._paused_s = 0.0
        with _running_lock:
            _running[self.name] = self
        return self

    def pause(self) -> None:
        if self._paused_at is not None:
            raise SlimeError(f"timer {self.name!r} is already paused")
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is None:
            raise SlimeError(f"timer {self.name!r} is not paused")
        self._paused_s += time.perf_counter() - self._paused_at
        self._paused_at = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._start is not None
        if self._paused_at is not None:  # the block ended inside an inverse_timer
            self.resume()
        with _running_lock:
            if _running.get(self.name) is self:
                del _running[self.name]
        self.elapsed = time.perf_counter() - self._start - self._paused_s
        if self.store is not None:
            if self.accumulate:
                self.store[self.key] = float(self.store.get(self.key, 0.0)) + self.elapsed
            else:
                self.store[self.key] = self.elapsed


def timer(name: str, store: dict[str, Any], *, accumulate: bool = False) -> Timer:
    """``with timer("train", metrics): ...`` records ``metrics["perf/train_time"]`` in seconds."""
    return Timer(name, store, accumulate=accumulate)


@contextmanager
def inverse_timer(name: str) -> Iterator[None]:
    """The block does not count towards the running timer `name` (slime's: it ends the timer
    before the block and starts it again after). No such timer running: SlimeError."""
    with _running_lock:
        running = _running.get(name)
    if running is None:
        raise SlimeError(f"inverse_timer({name!r}): no timer {name!r} is running")
    running.pause()
    try:
        yield
    finally:
        running.resume()


def with_defer(deferred_func: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: call `deferred_func()` after the function, also when it raises."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                deferred_func()

        return wrapper

    return decorator
