"""The `code` reward: run the sample's tests against the generated program in the sandbox.

The program is the last ```python fenced block of the response (else the last ``` block, else the
whole response). The tests come from `metadata["tests"]`, else from the label:

* a string: Python test code (asserts). A driver in the sandbox runs the program as `__main__`,
  then the tests against its names, and reports success only with a random token made for the run,
  written after the last test (`slime.sandbox.test_driver`): a program that exits before the tests, hooks
  `atexit` or the exception hook, patches builtins or returns objects that equal everything
  scores 0;
* a list of `{"input": stdin, "output": expected stdout}` cases: each runs the program alone;
  a case passes when the output matches line by line (trailing spaces and blank lines ignored).

The reward is 1.0 when every test passes, else 0.0 (a failing, crashing, timed-out or
memory-hungry program is a 0, not an error). The first failure's reason is kept in
`sample.metadata["code_result"]`. Tests missing or malformed are the data's error: the sample
is marked FAILED with that message. Limits: the `--sandbox-*` options (`SandboxLimits.from_args`);
at most `--sandbox-concurrency` programs run at once.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
from typing import Any

from slime.sandbox import SandboxLimits, driver_source, run_python

_FENCE_PY = re.compile(r"```python\s*(.*?)```", re.IGNORECASE | re.DOTALL)
_FENCE_ANY = re.compile(r"```(?:py)?\s*(.*?)```", re.IGNORECASE | re.DOTALL)
_slots: dict[int, threading.BoundedSemaphore] = {}


def extract_code(response: str | None) -> str:
    text = (response or "").strip()
    for pattern in (_FENCE_PY, _FENCE_ANY):
        blocks = pattern.findall(text)
        if blocks:
            return blocks[-1].strip()
    return text


def _norm_output(text: Any) -> str:
    lines = str("" if text is None else text).replace("\r\n", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip()


def _tests_of(sample: Any) -> Any:
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    tests = metadata.get("tests", sample.label)
    if isinstance(tests, str) and tests.strip():
        return tests
    if isinstance(tests, list) and tests and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
        return tests
    raise ValueError(
        "code reward: the sample has no tests (metadata['tests'] or the label must be test code "
        "or a list of {'input', 'output'} cases)"
    )


_MARK = "@@slime-tests-passed "  # as slime.sandbox.test_driver.MARK


def run_tests(code: str, tests: str, limits: SandboxLimits | None = None, **overrides: Any) -> tuple[float, str]:
    """Assert-style tests through the token driver: (1.0, "passed") only when the driver wrote this
    run's token after the last test."""
    token = secrets.token_hex(16)
    result = run_python(
        driver_source(),
        stdin=token,
        files={"solution.py": code, "tests.py": tests},
        limits=limits,
        proc_fs=False,
        **overrides,
    )
    last = result.stdout.rstrip("\n").rpartition("\n")[2]
    if result.ok and last == _MARK + token:
        return 1.0, "passed"
    if result.ok:  # exit status 0 without the token: the program ended the run itself
        return 0.0, "the tests did not run to the end (the program exited early or took over the output)"
    return 0.0, result.reason


def grade_code(code: str, tests: Any, limits: SandboxLimits | None = None, **overrides: Any) -> tuple[float, str]:
    """(reward, reason of the first failure or "passed") — blocking; runs in a worker thread."""
    if isinstance(tests, str):
        return run_tests(code, tests, limits, **overrides)
    for i, case in enumerate(tests):
        result = run_python(
            code, stdin=str(case["input"] if case["input"] is not None else ""), limits=limits, **overrides
        )
        if not result.ok:
            return 0.0, f"case {i}: {result.reason}"
        if _norm_output(result.stdout) != _norm_output(case["output"]):
            return 0.0, f"case {i}: wrong output"
    return 1.0, "passed"


async def code_reward(args: Any, sample: Any) -> float:
    tests = _tests_of(sample)
    concurrency = args.sandbox_concurrency
    slot = _slots.setdefault(concurrency, threading.BoundedSemaphore(concurrency))

    def job() -> tuple[float, str]:
        with slot:
            return grade_code(extract_code(sample.response), tests, SandboxLimits.from_args(args))

    reward, reason = await asyncio.to_thread(job)
    if isinstance(sample.metadata, dict):
        sample.metadata["code_result"] = reason
    return reward
