"""The code sandbox: untrusted Python (a policy's program, a tool call) run under isolation and limits.

    from slime.sandbox import SandboxLimits, run_python
    result = run_python(code, stdin="...", limits=SandboxLimits(timeout_s=5))

* `run`: `run_python`, its limits (`SandboxLimits`, from the `--sandbox-*` options) and result
  (`SandboxResult`), and the start-up check (`check_sandbox`);
* `bwrap`: how a program is isolated (bubblewrap namespaces, a pids cgroup when run as root) and
  the probe that tells whether that works here;
* `seccomp`: the system-call filter bubblewrap loads;
* `test_driver`: a script, never imported by the host: its source runs *inside* the sandbox as
  `main.py` and runs a solution, then its tests (`driver_source()`; the `code` reward of
  `slime.rollout.rm_hub` is its host side).

The sandbox stands on the ground layer only (slime.errors), so anything above it (rewards, agents'
tools, examples) may use it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from slime.sandbox.run import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    check_sandbox,
    isolation,
    run_python,
)


@lru_cache(maxsize=1)
def driver_source() -> str:
    """The source of `test_driver.py`, to run in the sandbox as `main.py` (read as a file: it is
    shipped with the package like any module, and importing it here would be of no use)."""
    return Path(__file__).with_name("test_driver.py").read_text(encoding="utf-8")


__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "driver_source",
    "isolation",
    "run_python",
]
