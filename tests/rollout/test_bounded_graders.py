"""The math graders are bounded: answers whose evaluation never ends score 0 in bounded time with
the reason recorded, the rollout's event loop keeps running meanwhile, the grader workers recover,
and normal answers grade as before.

Before: `\\boxed{9**9**9}` against a non-integer label ran sympy's eager evaluation on the event
loop past 120 s; `(10^{100})!` hung math-verify; `(x+1)**5000` keeps sympy busy past 40 s.
"""

import asyncio
import itertools
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from slime.errors import SlimeError
from slime.rollout.rm_hub import async_rm, grader_pool, math_grader, math_verify_rm
from slime.rollout.rm_hub import gpqa as gpqa_module
from slime.rollout.rm_hub.answer_screen import screen_answer
from slime.rollout.rm_hub.grader_pool import GradeRefused
from slime.utils.types import Sample
from tests.helpers import make_args

TIMEOUT = 2.0  # --math-grader-timeout in these tests
BOUND = 4 * TIMEOUT  # a refused grade ends within this, a replacement worker's start-up included
HALF = "\\frac{1}{2}"  # a non-integer label: the answer goes on to sympy, as slime's grader does


def grade(rm_type, response, label, timeout=TIMEOUT):
    """(reward, recorded reason, wall seconds) of one sample through async_rm."""
    sample = Sample(response=response, label=label, metadata={})
    start = time.monotonic()
    reward = asyncio.run(async_rm(make_args(rm_type=rm_type, math_grader_timeout=timeout), sample))
    return reward, sample.metadata.get("reward_error"), time.monotonic() - start


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    grader_pool.run(abs, -1)  # the first worker's start-up (about 1 s) is not part of any bound below
    yield
    grader_pool.shutdown()


def _worker_pids():
    """This process's live grader workers, from /proc (independent of the pool's own books)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"grader_pool" in cmdline:
            pids.append(int(entry))
    return pids


# ------------------------------------------------------------------------------- adversarial answers

BOMBS = {
    "tower **": "\\boxed{9**9**9**9}",
    "tower ** (the 120 s case)": "\\boxed{9**9**9}",
    "tower ^": "\\boxed{9^{9^{9^9}}}",
    "factorial of a tower": "\\boxed{10^{10^{10}}!}",
    "tower of 2s": "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "factorial of a googol": "\\boxed{(10^{100})!}",
    "big factorial": "\\boxed{99999999!}",
    "falling factorial": "\\boxed{ff(9**9,9**8)}",
    "binomial": "\\boxed{\\dbinom{10^{10}}{5 \\cdot 10^{9}}}",
    "huge exponent on a symbol": "\\boxed{x^{10^{10}}}",
    "1 MB answer": "\\boxed{" + "1" * (1 << 20) + "}",
    "nested frac bomb": "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
    "tower 500 deep": "\\boxed{" + "2^{" * 500 + "2" + "}" * 500 + "}",
    "unary chain": "\\boxed{" + "-" * 1000 + "9**9**9}",
    "passes the screen, sympy never ends": "\\boxed{(x+1)**5000}",  # > 40 s unbounded
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_math_bombs_score_0_in_bounded_time_with_the_reason(name):
    reward, reason, wall = grade("math", BOMBS[name], HALF)
    assert reward == 0.0
    assert wall < BOUND, f"{name}: {wall:.1f}s"
    assert isinstance(reason, str) and reason, name
    if name.startswith("passes the screen"):
        assert "timed out after 2s" in reason
    else:
        assert "timed out" not in reason  # refused by the screen, before any parsing


@pytest.mark.parametrize("name", ["tower **", "factorial of a googol", "1 MB answer", "nested frac bomb"])
def test_deepscaler_bombs(name):
    reward, reason, wall = grade("deepscaler", "<think>hmm</think> " + BOMBS[name], HALF)
    assert (reward, wall < BOUND, bool(reason)) == (0, True, True)


@pytest.mark.parametrize(
    "answer",
    [
        "\\boxed{9**9**9}",
        "\\boxed{(10^{100})!}",
        "\\boxed{10^{10^{10}}!}",
        "\\boxed{(x+1)^{5000}}",
        BOMBS["1 MB answer"],
    ],
)
def test_math_verify_bombs(answer):
    reward, reason, wall = grade("math_verify", answer, HALF)
    assert (reward, wall < BOUND, bool(reason)) == (0.0, True, True)


def test_slimes_sync_entry_points_are_bounded_too():
    start = time.monotonic()
    before = grader_pool.stats()["screened"]
    assert math_grader.grade_answer_verl("\\boxed{9**9**9}", "x") is False  # measured past 120 s before
    assert math_grader.grade_sympy("9**9**9", "x") is False
    assert time.monotonic() - start < 1.0
    assert grader_pool.stats()["screened"] == before + 2  # counted


# ------------------------------------------------------------------------------- event loop, recovery


def test_event_loop_keeps_running_while_a_grade_is_stuck():
    args = make_args(rm_type="math", math_grader_timeout=TIMEOUT)

    async def main():
        ticks, done = [], asyncio.Event()

        async def ticker():
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        stuck = Sample(response=BOMBS["passes the screen, sympy never ends"], label=HALF, metadata={})
        normal = [Sample(response="\\boxed{x+1}", label="1+x", metadata={}) for _ in range(4)]
        start = time.monotonic()
        rewards = await asyncio.gather(*(async_rm(args, s) for s in [stuck] + normal))
        wall = time.monotonic() - start
        done.set()
        await tick_task
        return stuck, rewards, wall, ticks

    stuck, rewards, wall, ticks = asyncio.run(main())
    assert rewards == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert "timed out" in stuck.metadata["reward_error"]
    assert TIMEOUT * 0.9 < wall < BOUND  # the stuck grade ran to its limit, and no further
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) > wall / 0.01 / 4 and max(gaps) < 0.5  # blocked, the loop would stall 2 s


def test_sympy_and_math_verify_never_run_in_the_rollout_process():
    code = textwrap.dedent(r"""
        import asyncio, sys
        from slime.rollout.rm_hub import async_rm
        from slime.utils.types import Sample
        from tests.helpers import make_args
        cases = [("math", "\\boxed{x+1}", "1+x"), ("math", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
                 ("deepscaler", "</think>\\boxed{2\\pi}", "\\pi*2"), ("math_verify", "\\boxed{0.5}", "1/2")]
        print([asyncio.run(async_rm(make_args(rm_type=t), Sample(response=r, label=l))) for t, r, l in cases])
        print(sorted(m for m in ("sympy", "math_verify") if m in sys.modules))
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1.0, 1.0, 1, 1.0]", "[]"]  # all settled by workers


def test_pool_recovers_after_a_timeout_and_a_crash():
    before = grader_pool.stats()
    reward, reason, _ = grade("math", BOMBS["passes the screen, sympy never ends"], HALF, timeout=1.0)
    assert reward == 0.0 and "timed out after 1s" in reason
    with pytest.raises(GradeRefused, match="worker died") as crash:
        grader_pool.run(os._exit, 3)
    assert crash.value.kind == "crashed"
    grader_pool.refused(crash.value)
    # the next grades work (sympy needed: x+1 and 1+x differ as strings) and leave no reason behind
    sample = Sample(response="\\boxed{x+1}", label="1+x", metadata={"reward_error": "stale"})
    assert asyncio.run(async_rm(make_args(rm_type="math"), sample)) == 1.0
    assert "reward_error" not in sample.metadata
    assert grade("math", "\\boxed{x+2}", "1+x")[:2] == (0.0, None)  # a verdict, not a refusal
    after = grader_pool.stats()
    assert (after["timeout"] - before["timeout"], after["crashed"] - before["crashed"]) == (1, 1)
    time.sleep(0.2)
    assert 1 <= len(_worker_pids()) <= grader_pool.WORKERS  # killed workers are gone, none leaked


def test_pool_time_and_memory_limits_hold_for_any_call():
    start = time.monotonic()
    with pytest.raises(GradeRefused, match="timed out after 0.5s") as e:
        grader_pool.run(time.sleep, 30, timeout=0.5)
    assert e.value.kind == "timeout" and time.monotonic() - start < 1.5
    assert grader_pool.run(divmod, 7, 2, timeout=0.5) == (3, 1)
    with pytest.raises(GradeRefused, match="more than 2048 MB") as e:  # the worker's memory limit
        grader_pool.run(bytearray, 3 << 30)
    assert e.value.kind == "memory" and grader_pool.run(abs, -2) == 2
    with pytest.raises(ValueError, match="invalid literal"):  # the job's own error is the caller's
        grader_pool.run(int, "x")


# ------------------------------------------------------------------------------- normal answers

# Verdicts from the mathematics and slime's stated rules (an integer label needs an integer answer;
# unreduced slash fractions must match as written; tuples compare element-wise with their brackets).
MATH_CASES = [
    ("\\boxed{x+1}", "1+x", 1.0),
    ("\\boxed{2\\pi}", "\\pi*2", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("\\boxed{\\sqrt{8}}", "3\\sqrt{2}", 0.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{0.3333}", "\\frac{1}{3}", 0.0),
    ("\\boxed{65}", "65", 1.0),
    ("\\boxed{065}", "65", 1.0),
    ("\\boxed{64}", "65", 0.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{2^{10}}", "1024", 0.0),  # an integer label needs an integer answer
    ("\\boxed{2/4}", "\\frac{1}{2}", 0.0),  # unreduced
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{[1,2)}", "(1,2)", 0.0),
    ("\\boxed{2^{2023}}", "2^{2023}", 1.0),
    ("\\boxed{2023!}", "2023!", 1.0),
    ("\\boxed{e^{-x^2}}", "e^{-x^{2}}", 1.0),
    ("no box", "65", 0.0),
]


@pytest.mark.parametrize("response,label,reward", MATH_CASES)
def test_normal_answers_grade_as_before(response, label, reward):
    got, reason, _ = grade("math", response, label)
    assert (got, reason) == (reward, None)
    # the same verdict as slime's grading run unbounded, in this process (the old code path)
    given, truth = math_grader.extract_answer(response), label
    old = given is not None and (
        math_grader.grade_mathd(given, truth) or math_grader._grade_sympy_unbounded(given, truth)
    )
    assert float(old) == reward
    deep, deep_reason, _ = grade("deepscaler", "<think>x</think>" + response, label)
    assert (deep, deep_reason) == (int(reward), None)


@pytest.mark.parametrize(
    "response,label,reward",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{\\sqrt{8}}", "$2\\sqrt{2}$", 1.0),
        ("\\boxed{\\sqrt{8}}", "$3\\sqrt{2}$", 0.0),
        ("\\boxed{3}", "4", 0.0),
        ("\\boxed{(1,2)}", "(1,2)", 1.0),
    ],
)
def test_math_verify_normal_answers(response, label, reward):
    assert grade("math_verify", response, label)[:2] == (reward, None)
    old = math_verify_rm._verify_unbounded(math_grader.extract_answer(response), label)  # run in this process
    assert old == reward


# ------------------------------------------------------------------------------- the screen itself

REAL_ANSWERS = [
    "65",
    "-3",
    "\\frac{\\sqrt{3}}{2}",
    "2^{2023}",
    "2^{2023}-1",
    "e^{-x^2}",
    "(x+1)^{10}",
    "10!",
    "2023!",
    "\\binom{10}{3}",
    "{10 \\choose 3}",
    "1.5 \\times 10^{7}",
    "x^{2}+y^{2}",
    "\\sqrt[3]{2}",
    "[1, 2)",
    "\\{1,2,3\\}",
    "f(x) = x^2",
    "\\left( \\frac{1}{2}, 3 \\right)",
    "3^{100}",
    "\\dfrac{2^{100}}{3}",
    "0.000001",
    "10^{-7}",
    "\\text{(A)}",
    "x^{1/2}",
    "\\pi/4",
    "(-\\infty, 3]",
    "k=3",
    "1,000,000",
    "2^{2^{10}}",
    "e^{i\\pi}",
    "\\sqrt{2 \\times 10^{7}}",
    "5!!",
    "\\log_2(10^{6})",
    "123456789012345678901234",
    "\\$1{,}000",
    "90^\\circ",
    "\\mathbf{(B)}",
    "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
    "x \\in (0, 1]",
]


@pytest.mark.parametrize("answer", REAL_ANSWERS)
def test_screen_lets_real_answers_through(answer):
    assert screen_answer(answer) is None


def test_screen_is_fast_on_the_longest_inputs():
    for text in ["2^" * 1000 + "2", "(" * 1000, "\\frac{1}{" * 200, "9" * 2000, "x!" * 1000, "1+" * 1000]:
        best = float("inf")
        for _ in range(3):  # the best of three: a busy machine's pauses are not the screen's
            start = time.monotonic()
            screen_answer(text)
            best = min(best, time.monotonic() - start)
        assert best < 0.1, text[:20]  # about 5 ms measured


# ------------------------------------------------------------------------------- options


def test_math_grader_timeout_option():
    assert make_args().math_grader_timeout == 5.0
    assert make_args(math_grader_timeout=0.5).math_grader_timeout == 0.5
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SlimeError, match="--math-grader-timeout must be a finite number of seconds > 0"):
            make_args("--math-grader-timeout", bad)


# ------------------------------------------------------------------------------- gpqa's regexes

_OLD_GPQA = (  # the backtracking patterns, the reference for what the linear ones must match
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)", re.IGNORECASE),
    re.compile(r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
)


def test_gpqa_patterns_match_as_before_in_linear_time():
    import random

    rng = random.Random(0)
    words = ["answer", "is", ":", " ", "  ", "\n", "A", "b", "the", "correct", "final", "option", "choice", "5", "."]
    for _ in range(3000):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        for old, new in zip(_OLD_GPQA, gpqa_module._LETTER_PATTERNS, strict=True):
            a, b = old.search(text), new.search(text)
            assert (a and (a.span(), a.group(1))) == (b and (b.span(), b.group(1))), text
    start = time.monotonic()  # 17 s and 33 s with the backtracking patterns
    assert gpqa_module.gpqa_reward("answer" + " " * 40000 + "!", "B") == 0.0
    assert gpqa_module.gpqa_reward("final" + " " * 40000 + "answer" + " " * 40000, "B") == 0.0
    assert time.monotonic() - start < 1.0


def test_refused_grades_are_counted_in_the_rollout_metrics():
    """A refused answer scores 0 and is counted (rollout/reward_refused), not silently averaged in."""
    from slime.rollout.train_data import rollout_metrics, samples_to_train_data

    args = make_args(rm_type="math", n_samples_per_prompt=2)
    group = [
        Sample(prompt="p", response="\\boxed{9**9**9**9}", label="1.5", index=0),
        Sample(prompt="p", response="\\boxed{1.5}", label="1.5", index=1),
    ]
    for s in group:
        s.reward = asyncio.run(async_rm(args, s))
        s.tokens, s.response_length, s.loss_mask, s.status = [1, 2, 3], 2, [1, 1], Sample.Status.COMPLETED
    assert [s.reward for s in group] == [0, 1] and "reward_error" in group[0].metadata
    metrics = rollout_metrics(args, [group], samples_to_train_data(args, [group]))
    assert metrics["rollout/reward_refused"] == 1.0
