"""Assert-style tests graded in two processes: the solution's values, then a judge that never ran it.

    reward, reason = grade_assert_tests(program, "assert add(1, 2) == 3", limits)

1. `split_tests` (here, on the host, with `ast` only) splits the tests into the sandbox's steps (the
   calls into the solution and statements run for their effect) and the judging statements.
2. The sandbox (`run_python`, bubblewrap, no new processes) runs the solution and the steps
   (`probe_runner`), printing each probe's value as plain data; it never sees an expected value
   that is not also an input.
3. A fresh judge process (`judge_runner`: the host's own Python, `-I`, under the same CPU, memory
   and wall-time limits) rebuilds the values as plain Python objects and runs the judging
   statements. Nothing the solution did can reach it: no object, function, frame or module of the
   solution's interpreter exists there, only numbers, strings and containers of them.

Whatever the solution does in its own process (exit early, patch builtins, hook signals, read the
driver's memory, return objects that equal everything) can only change the values it reports,
which is what a wrong program does anyway.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from slime.sandbox.bwrap import python_paths
from slime.sandbox.run import SandboxLimits, run_python
from slime.sandbox.split_tests import TestPlan, split_tests

VERDICT = "@@slime-judge "  # as judge_runner.MARK


@cache
def runner_source(name: str) -> str:
    """The source of `probe_runner.py` / `judge_runner.py`: scripts run in other processes, shipped
    with the package like any module and read as files (importing them here would be of no use)."""
    return Path(__file__).with_name(name).read_text(encoding="utf-8")


def grade_assert_tests(code: str, tests: str | TestPlan, limits: SandboxLimits | None = None) -> tuple[float, str]:
    """(1.0, "passed") when every assert holds, else (0.0, the first failure). Raises
    `UnsplittableTests` (a ValueError: the data's error) for tests the split cannot judge."""
    limits = limits or SandboxLimits()
    plan = tests if isinstance(tests, TestPlan) else split_tests(tests)
    steps = json.dumps([[s.kind, s.source] for s in plan.steps])
    result = run_python(
        runner_source("probe_runner.py"),
        files={"solution.py": code, "probes.json": steps},
        limits=limits,
        proc_fs=False,
        new_processes=False,
    )
    if not result.ok:
        return 0.0, result.reason
    return judge(plan, result.stdout, limits)


def judge(plan: TestPlan, output: str, limits: SandboxLimits) -> tuple[float, str]:
    """Run the judging statements on the values in `output` in a fresh process."""
    request = {
        "judge": [[j.line, j.source] for j in plan.judge],
        "steps": [[s.line, s.source, s.kind] for s in plan.steps],
        "output": output,
    }
    exe, _ = python_paths()
    cpu, mem = max(1, round(limits.cpu_s)), int(limits.memory_mb) << 20

    def bounded() -> None:  # in the child: the judge runs the data set's code, bounded like any grader
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    with tempfile.TemporaryDirectory(prefix="slime-judge-") as cwd:
        try:
            done = subprocess.run(
                [exe, "-I", "-B", "-c", runner_source("judge_runner.py")],
                input=json.dumps(request).encode(),
                capture_output=True,
                timeout=limits.timeout_s,
                cwd=cwd,
                env={"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
                preexec_fn=bounded,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return 0.0, "the judge ran past the wall-time limit"
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(VERDICT):
            verdict = json.loads(line[len(VERDICT) :])
            return (1.0, "passed") if verdict["passed"] else (0.0, str(verdict["reason"]))
    last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return 0.0, f"the judge failed: {last[:300]}"
