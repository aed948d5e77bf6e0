"""Built-in reward models, selected by `--rm-type` (slime's `slime.rollout.rm_hub`).

`async_rm(args, sample)` returns one sample's reward; `batched_async_rm(args, samples)` a list.
Types (each gives slime's reward on the same input): `math` (last boxed answer, MATH normalisation
+ sympy), `deepscaler` (the same, on the text after `</think>` / `###Response` only), `dapo`
(`{score: +-1, acc, pred}` from an `Answer:` line), `f1` (token F1), `gpqa` (multiple choice),
`math_verify` (math-verify), `remote_rm` (`--rm-url`), `code` (tests run in a sandbox), `ifbench`
(IFBench's instruction checks, from the sample's metadata), `random`
(0 or 1 at random: a baseline for plumbing tests); a `boxed_` prefix grades the last `\\boxed{}`
content instead of the whole response.
The math family (`math`, `deepscaler`, `math_verify`) is bounded: answers are screened before any
parsing, sympy / math-verify run in worker processes (`grader_pool`) for at most
`--math-grader-timeout` seconds, on grader threads the event loop awaits. A refused or timed-out
grade scores 0 and its reason goes to `sample.metadata["reward_error"]` (`dapo` reads 300
characters with string rules only: nothing to bound).
`code` runs the program in the bubblewrap sandbox (`slime.sandbox`), which only reports the values
of the tests' calls into it; the asserts run in a judge process that never ran the program
(`slime.sandbox.assert_tests`).

Adversarial list: what a policy was tried with, through this API, and scores 0 or is refused
(tests/sandbox/test_reward_hacking.py, tests/sandbox/test_sandbox.py,
tests/rollout/test_bounded_graders.py): exits before the tests (os._exit, sys.exit, atexit,
exception hook, killing itself), objects equal to everything (against ==, tolerances, `in`,
ordering, chained comparisons), patched or shadowed builtins and math.isclose, forged verdict or
value lines, closed or redirected output, rewriting the judge's functions, signal handlers reading
frames, subprocesses, values nested or sized to break the judge, host files read or written (also after umount/remount),
loopback network, signals to host processes, fork storms, output floods, disk fill, outliving a
killed parent; math answers that would hang sympy or exhaust memory.
Labels are kept as the data file holds them (any JSON value, as in slime). The text graders (`math`,
`deepscaler`, `dapo`, `f1`, `math_verify`) take a string or a number (graded as its text, as slime's
`str()` does); `gpqa` also an option index; `code` test code or a list of cases; `remote_rm` sends
the label as it is. A label a grader cannot read (an object for `math`) marks the sample FAILED
with `LabelTypeError` naming it, never a silent 0; structured labels are graded by a custom reward.
With `--custom-rm-path` set, that function is used instead (slime's convention: called with one
sample by `async_rm`, with the whole list by `batched_async_rm`); a sample's own `custom_rm_path`
(an eval data set's) comes first in `async_rm`. A sample's `metadata["rm_type"]` overrides
`--rm-type` for that sample (mixed datasets).

slime's scorer names are here too: `get_deepscaler_rule_based_reward`, `grade_answer_verl`,
`compute_score_dapo`, `f1_score`, `compute_gpqa_reward`, `extract_boxed_answer` (slime's strict
one: the content of the last `\\boxed{...}`, None without a `\\boxed`), `remote_rm`.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import inspect
import json
import random
from collections.abc import Callable
from typing import Any

from slime.errors import SlimeError
from slime.rollout.rm_hub import grader_pool
from slime.rollout.rm_hub.code import code_reward
from slime.rollout.rm_hub.deepscaler import deepscaler_reward_checked, get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward, gpqa_reward
from slime.rollout.rm_hub.ifbench import compute_ifbench_reward
from slime.rollout.rm_hub.math_dapo import compute_score
from slime.rollout.rm_hub.math_dapo import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_grader import extract_answer, grade_answer_verl, grade_answer_verl_checked
from slime.rollout.rm_hub.math_grader import extract_answer as extract_boxed_answer  # slime's (strict) meaning
from slime.rollout.rm_hub.math_utils import grade_math, is_equiv, normalize_answer
from slime.rollout.rm_hub.math_verify_rm import math_verify_reward_checked
from slime.rollout.rm_hub.remote import remote_rm
from slime.utils.misc import load_function
from slime.utils.types import Sample


class LabelTypeError(TypeError):
    """A built-in reward was given a label of a type it cannot grade (the sample is marked FAILED)."""


REWARD_ERROR_KEY = "reward_error"  # why a bounded grade scored 0 without a verdict
_INLINE_CHARS = 4096  # string checks on a response this short take well under a millisecond


async def _bounded(args, metadata, fn, response, label):
    """`fn(response, label, timeout=...)` -> (reward, reason): inline when string checks settle a
    short response, else on a grader thread (sympy / math-verify in a worker). The reason of a
    refused grade is recorded in the sample's metadata (and cleared by a later verdict)."""
    timeout = args.math_grader_timeout
    try:
        if not isinstance(response, str) or len(response) > _INLINE_CHARS:
            raise grader_pool.NeedsWorker
        with grader_pool.no_workers():
            reward, reason = fn(response, label, timeout=timeout)
    except grader_pool.NeedsWorker:
        reward, reason = await grader_pool.run_in_thread(fn, response, label, timeout=timeout)
    if reason is None:
        metadata.pop(REWARD_ERROR_KEY, None)
    else:
        metadata[REWARD_ERROR_KEY] = reason
    return reward


def text_label(rm_type: str, label: Any) -> str | None:
    """The label a string grader compares with. A number becomes its text, as slime's graders
    `str()` it (a JSON label 65 grades as "65"); a label of another type (an object, a list) is
    not a text answer: grading its repr would give a silent 0 on every sample, so it is an error
    (the sample is FAILED with this message)."""
    if label is None or isinstance(label, str):
        return label
    if isinstance(label, (int, float)):  # bool too (JSON true/false): slime's graders str() it the same way
        return str(label)
    shown = json.dumps(label, ensure_ascii=False, default=str)
    raise LabelTypeError(
        f"the {rm_type!r} reward grades a string or number label, but this sample's label is a "
        f"{type(label).__name__}: {shown[:200]}; put the answer text in the label column (--label-key), "
        "or grade structured labels with --custom-rm-path"
    )


async def _math_rm(args, sample, response, label, metadata):
    if label:  # slime's math grader scores a falsy label (the number 0 too) 0 before reading it
        label = text_label("math", label)
    ok = await _bounded(args, metadata, grade_answer_verl_checked, response, label)
    return 1.0 if ok else 0.0  # grade_math's values


def _dapo_rm(args, sample, response, label, metadata):
    return compute_score(response, text_label("dapo", label))


async def _deepscaler_rm(args, sample, response, label, metadata):
    return await _bounded(args, metadata, deepscaler_reward_checked, response, text_label("deepscaler", label))


def _f1_rm(args, sample, response, label, metadata):
    return f1_score(response, text_label("f1", label))[0]


def _gpqa_rm(args, sample, response, label, metadata):
    # slime's gpqa reads a string label or an index; any other label is unused, which leaves the
    # right option to the metadata: without one there, the sample could only score 0
    if not (label is None or isinstance(label, (str, int, float))) and not any(
        metadata.get(key) for key in ("correct_letter", "correct_answer", "answer_text")
    ):
        text_label("gpqa", label)  # raises, naming the label
    return gpqa_reward(response, label, metadata=metadata)


async def _math_verify_rm(args, sample, response, label, metadata):
    return await _bounded(args, metadata, math_verify_reward_checked, response, text_label("math_verify", label))


def _ifbench_rm(args, sample, response, label, metadata):
    return compute_ifbench_reward(response, label, metadata=metadata)


def _random_rm(args, sample, response, label, metadata):
    return random.randint(0, 1)


async def _remote_rm(args, sample, response, label, metadata):
    return await remote_rm(args, sample)  # the service gets the sample as it is (slime's protocol)


async def _code_rm(args, sample, response, label, metadata):
    if response is not sample.response:  # boxed_code: grade the extracted text
        sample = copy.copy(sample)
        sample.response = response
    return await code_reward(args, sample)


# name -> function(args, sample, response, label, metadata) -> reward (sync or async).
# Add a reward model here and it is known everywhere. A `boxed_` prefix on any of them
# (`--rm-type boxed_f1`) first replaces the response by its last `\\boxed{}` content ("" if none).
_RM_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "math": _math_rm,
    "dapo": _dapo_rm,
    "deepscaler": _deepscaler_rm,
    "f1": _f1_rm,
    "gpqa": _gpqa_rm,
    "math_verify": _math_verify_rm,
    "remote_rm": _remote_rm,
    "code": _code_rm,
    "random": _random_rm,
    "ifbench": _ifbench_rm,
}
RM_TYPES: tuple[str, ...] = tuple(_RM_FUNCTIONS)
BOXED_PREFIX = "boxed_"


def validate_rm_type(name: str | None) -> str:
    """Return `name` if it is a known reward model type; else raise naming --rm-type and the choices."""
    base = name[len(BOXED_PREFIX) :] if isinstance(name, str) and name.startswith(BOXED_PREFIX) else name
    if base not in _RM_FUNCTIONS:
        close = difflib.get_close_matches(str(name), RM_TYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SlimeError(
            f"--rm-type {name!r} is not a known reward model; known types: {', '.join(RM_TYPES)} "
            f"(each also with a {BOXED_PREFIX!r} prefix), or set --custom-rm-path to your own function{hint}"
        )
    return name


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _custom_rm(args: Any) -> Callable | None:
    path = args.custom_rm_path
    return load_function(path, arg_name="--custom-rm-path") if path else None


def _rm_type_of(args: Any, sample: Sample) -> str | None:
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = metadata.get("rm_type") or args.rm_type
    if isinstance(rm_type, str):
        rm_type = rm_type.strip()
    if not rm_type:
        raise SlimeError("no reward model: set --rm-type (one of: " + ", ".join(RM_TYPES) + ") or --custom-rm-path")
    return rm_type


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> Any:
    """The reward of one sample (a number, or a dict for `dapo` / a dict-answering service)."""
    if getattr(sample, "custom_rm_path", None):  # a per-sample reward (an eval data set's) comes first
        fn = load_function(sample.custom_rm_path, arg_name="Sample.custom_rm_path")
        return await _maybe_await(fn(args, sample, **kwargs))
    custom = _custom_rm(args)
    if custom is not None:
        return await _maybe_await(custom(args, sample, **kwargs))
    rm_type = validate_rm_type(_rm_type_of(args, sample))
    response, label = sample.response, sample.label
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    if rm_type.startswith(BOXED_PREFIX):
        response = extract_answer(response) or ""
        rm_type = rm_type[len(BOXED_PREFIX) :]
    return await _maybe_await(_RM_FUNCTIONS[rm_type](args, sample, response, label, metadata))


async def batched_async_rm(args: Any, samples: list[Sample], **kwargs: Any) -> list[float]:
    """Rewards of a list of samples (a custom reward function gets the whole list at once)."""
    custom = _custom_rm(args)
    if custom is not None:
        return list(await _maybe_await(custom(args, samples, **kwargs)))
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))


__all__ = [
    "RM_TYPES",
    "LabelTypeError",
    "text_label",
    "validate_rm_type",
    "async_rm",
    "batched_async_rm",
    "grade_math",
    "normalize_answer",
    "is_equiv",
    # slime's names
    "remote_rm",
    "get_deepscaler_rule_based_reward",
    "f1_score",
    "compute_gpqa_reward",
    "compute_score_dapo",
    "extract_boxed_answer",
    "grade_answer_verl",
]
