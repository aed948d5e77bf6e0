"""Wall-clock timers that record ``perf/<name>_time`` (seconds) into a metrics dict.

store = {}
with timer("rollout", store):
    ...
store  # {"perf/rollout_time": 1.23}
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

__all__ = ["Timer", "timer", "metric_key"]


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

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._start is not None
        self.elapsed = time.perf_counter() - self._start
        if self.store is not None:
            if self.accumulate:
                self.store[self.key] = float(self.store.get(self.key, 0.0)) + self.elapsed
            else:
                self.store[self.key] = self.elapsed


def timer(name: str, store: dict[str, Any], *, accumulate: bool = False) -> Timer:
    """``with timer("train", metrics): ...`` records ``metrics["perf/train_time"]`` in seconds."""
    return Timer(name, store, accumulate=accumulate)
