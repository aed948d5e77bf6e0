"""Process liveness: every child server (engine, router, dispatcher) exits when its parent dies."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def start_parent_watchdog(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    """A daemon thread that SIGTERMs this process (then exits hard) once `parent_pid` is gone."""
    direct_child = os.getppid() == parent_pid

    def parent_alive() -> bool:
        if direct_child and os.getppid() != parent_pid:  # re-parented: the parent died
            return False
        return pid_alive(parent_pid)

    def watch() -> None:
        while parent_alive():
            time.sleep(interval)
        logger.warning("parent process %d is gone; shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(1)

    t = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    t.start()
    return t
