"""A process's memory as the system sees it: RSS, and giving freed heap pages back."""

from __future__ import annotations

import ctypes


def rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def trim_heap() -> None:
    """Give freed heap pages back to the system: large tensors are returned when freed, small ones
    stay in malloc's arenas until trimmed (glibc; a no-op elsewhere). No gc.collect(): it costs
    ~0.2 s with torch loaded, and what is freed here is freed by reference counting."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
