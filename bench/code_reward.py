"""Benchmark: the code reward's time per sample, graded in two processes, beside one sandbox run
that executes the same solution and tests together in one interpreter (what grading cost when the
tests ran beside the solution; the design it replaced did exactly that one run).

    .venv/bin/python bench/code_reward.py [--repeats 20] [--tests 10]

For a problem with `--tests` assert-style tests, interleaved so machine noise hits both alike:
* one interpreter: `run_python(solution + tests)` in the bubblewrap sandbox;
* split (`grade_code`): the sandbox run evaluating the calls into the solution, then the judge
  process running the asserts on their values.
Prints the median and the ratio (the split must stay under 2x), plus the CPU.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from slime.rollout.rm_hub.code import grade_code
from slime.sandbox import SandboxLimits, isolation, run_python

SOLUTION = "def add(a, b):\n    return a + b\n"


def cpu() -> str:
    model, flags = platform.processor() or "?", ""
    try:
        text = open("/proc/cpuinfo").read()
        model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        flags = " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in text) or "no avx512_bf16/amx"
    except (OSError, StopIteration):
        pass
    return f"{model} ({flags})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tests", type=int, default=10)
    a = parser.parse_args()
    if isolation() != "bwrap":
        raise SystemExit("bubblewrap is not available here: run `bash scripts/setup.sh` first")
    tests = "\n".join(f"assert add({i}, {2 * i}) == {3 * i}" for i in range(a.tests))
    limits = SandboxLimits()
    together, split = [], []
    for _ in range(2):  # warm-up: page cache, the interpreter's first start
        run_python(SOLUTION + tests, limits=limits)
        grade_code(SOLUTION, tests, limits)
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        result = run_python(SOLUTION + tests, limits=limits)
        together.append(time.perf_counter() - t0)
        assert result.ok, result.reason
        t0 = time.perf_counter()
        verdict = grade_code(SOLUTION, tests, limits)
        split.append(time.perf_counter() - t0)
        assert verdict == (1.0, "passed"), verdict
    one, two = statistics.median(together), statistics.median(split)
    print(f"code reward, {a.tests} assert tests, median of {a.repeats} ({time.strftime('%Y-%m-%d')}, {cpu()})")
    print(f"  one interpreter (solution and tests together): {one * 1000:7.1f} ms")
    print(f"  split (sandbox values + judge process):        {two * 1000:7.1f} ms")
    print(f"  ratio split / one interpreter:                  {two / one:7.2f}x")


if __name__ == "__main__":
    main()
