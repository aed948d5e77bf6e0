"""The `code` reward: run the sample's tests against the generated program in the sandbox.

The program is the last ```python fenced block of the response (else the last ``` block, else the
whole response). The tests come from `metadata["tests"]`, else from the label:

* a string: Python test code (asserts), graded in two processes (`slime.sandbox.assert_tests`):
  the sandbox runs the program and evaluates only the calls into it, returning their values as
  plain data; a separate judge process, which never ran a line of the program, runs the asserts
  on those values. Tests whose shape cannot be split that way are the data's error, refused when
  the data loads (`check_code_tests`);
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
import threading
from dataclasses import replace
from typing import Any

from slime.sandbox import SandboxLimits, grade_assert_tests, run_python
from slime.sandbox.split_tests import split_tests

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


def check_code_tests(sample: Any) -> None:
    """At data-loading time: the sample's tests exist and, when assert-style, can be split for the
    judge (raises ValueError naming the line and why)."""
    tests = _tests_of(sample)
    if isinstance(tests, str):
        split_tests(tests)


def grade_code(code: str, tests: Any, limits: SandboxLimits | None = None, **overrides: Any) -> tuple[float, str]:
    """(reward, reason of the first failure or "passed") — blocking; runs in a worker thread."""
    if isinstance(tests, str):
        return grade_assert_tests(code, tests, replace(limits or SandboxLimits(), **overrides))
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
