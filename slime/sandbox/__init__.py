"""The code sandbox: untrusted Python (a policy's program, a tool call) run under isolation and limits.

    from slime.sandbox import SandboxLimits, run_python
    result = run_python(code, stdin="...", limits=SandboxLimits(timeout_s=5))

* `run`: `run_python`, its limits (`SandboxLimits`, from the `--sandbox-*` options) and result
  (`SandboxResult`), and the start-up check (`check_sandbox`);
* `bwrap`: how a program is isolated (bubblewrap namespaces, a memory+pids cgroup bounding all its
  processes together) and
  the probe that tells whether that works here;
* `seccomp`: the system-call filter bubblewrap loads (optionally refusing new processes);
* `assert_tests`: assert-style tests graded in two processes (`grade_assert_tests`): `split_tests`
  splits them on the host; `probe_runner` runs in the sandbox beside the solution and reports the
  values of the calls into it; `judge_runner` runs the asserts on those values in a process that
  never ran the solution (the two runners are scripts, never imported by the host).

The sandbox stands on the ground layer only (slime.errors), so anything above it (rewards, agents'
tools, examples) may use it.
"""

from __future__ import annotations

from slime.sandbox.assert_tests import grade_assert_tests
from slime.sandbox.run import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    check_sandbox,
    isolation,
    run_python,
)

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "grade_assert_tests",
    "isolation",
    "run_python",
]
