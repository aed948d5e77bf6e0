"""Answer helpers: `\\boxed{...}` extraction and a conservative answer normaliser.

`grade_math` (the `math` reward) follows slime's rules exactly and lives in `math_grader.py`;
the helpers below are utilities for hooks (a lenient extractor that also reads `\\boxed 5` and
`\\fbox{}`, and a value-preserving comparison). Plain functions, no state.
slime's own names in this module (`extract_answer`, `grade_answer_verl`, `grade_answer_mathd`,
`grade_answer_sympy`, `last_boxed_only_string`, `remove_boxed`, `mathd_normalize_answer`) are the
`math_grader` functions, with slime's behaviour, and so are its sympy helpers (`are_equal_under_sympy`,
bounded here, `should_allow_eval`, `split_tuple`, `count_unknown_letters_in_expr`); `extract_boxed_answer` here is the lenient one
(slime's strict one is `extract_answer`, which `slime.rollout.rm_hub.extract_boxed_answer` is, as in slime).
`normalize_answer` removes formatting that never changes a value (spaces, `$`, a trailing `.`,
thousands separators, `\\text{}`, `\\left`/`\\right`); `is_equiv` compares numbers by value
(`65` == `65.0` == `130/2`); anything else must match exactly.
"""

from __future__ import annotations

import re
from fractions import Fraction

from slime.rollout.rm_hub import grader_pool
from slime.rollout.rm_hub.math_grader import (
    _may_evaluate,
    _split_tuple,
    _sympy_equal,
    extract_answer,
    grade_answer_verl,
)
from slime.rollout.rm_hub.math_grader import grade_mathd as grade_answer_mathd
from slime.rollout.rm_hub.math_grader import grade_sympy as grade_answer_sympy
from slime.rollout.rm_hub.math_grader import last_boxed as last_boxed_only_string
from slime.rollout.rm_hub.math_grader import mathd_normalize as mathd_normalize_answer
from slime.rollout.rm_hub.math_grader import strip_boxed as remove_boxed

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _scan_braced(text: str, open_idx: int) -> int | None:
    """Index just past the `}` matching the `{` at `open_idx`, or None if it never closes."""
    depth = 0
    i = open_idx
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2  # an escaped brace \{ or \} does not count
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _last_box_start(text: str) -> tuple[int, str] | None:
    """Position and command of the last `\\boxed` / `\\fbox` that is not part of a longer name."""
    best: tuple[int, str] | None = None
    for cmd in _BOX_COMMANDS:
        start = len(text)
        while True:
            i = text.rfind(cmd, 0, start)
            if i < 0:
                break
            after = i + len(cmd)
            if after < len(text) and text[after].isalpha():  # e.g. \boxedsomething
                start = i
                continue
            if best is None or i > best[0]:
                best = (i, cmd)
            break
    return best


def extract_boxed_answer(text: str | None) -> str | None:
    """Content of the LAST `\\boxed{...}` (balanced braces) or `\\boxed 5` in `text`, else None.

    An unclosed last box (a truncated response) counts as no answer.
    """
    if not text:
        return None
    found = _last_box_start(text)
    if found is None:
        return None
    i, cmd = found
    j = i + len(cmd)
    k = j
    while k < len(text) and text[k] in " \t":
        k += 1
    if k < len(text) and text[k] == "{":
        end = _scan_braced(text, k)
        if end is None:
            return None
        return text[k + 1 : end - 1]
    if k > j:  # `\boxed 5`: the argument runs to the next whitespace or `$`
        m = re.match(r"[^\s$]+", text[k:])
        return m.group(0) if m else None
    return None


_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{")
_SPACING = re.compile(r"\\left|\\right|\\[!,;: ]|\\quad|\\qquad")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_SLASH_FRAC = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_TEX_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")


def _unwrap(s: str) -> str:
    """`\\text{abc}` -> `abc` (balanced braces, repeatedly)."""
    while True:
        m = _WRAPPERS.search(s)
        if not m:
            return s
        end = _scan_braced(s, m.end() - 1)
        if end is None:
            return s
        s = s[: m.start()] + s[m.end() : end - 1] + s[end:]


def normalize_answer(answer: str | None) -> str | None:
    """A conservative canonical form of an answer string (None stays None)."""
    if answer is None:
        return None
    s = str(answer).strip()
    inner = extract_boxed_answer(s) if "\\boxed" in s or "\\fbox" in s else None
    if inner is not None:
        s = inner
    s = _unwrap(s)
    s = _SPACING.sub("", s)
    s = s.replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\s+", "", s)
    while s.endswith(".") and not s.endswith(".."):
        s = s[:-1]
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def to_number(s: str | None) -> Fraction | None:
    """The exact value of a normalised integer, decimal or simple fraction, else None."""
    if not s:
        return None
    try:
        if _DECIMAL.match(s):
            return Fraction(s)
        m = _SLASH_FRAC.match(s)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _TEX_FRAC.match(s)
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


def is_equiv(answer: str | None, label: str | None) -> bool:
    """Whether two answers are the same after conservative normalisation."""
    a, b = normalize_answer(answer), normalize_answer(label)
    if a is None or b is None or a == "" or b == "":
        return False
    if a == b:
        return True
    na, nb = to_number(a), to_number(b)
    return na is not None and nb is not None and na == nb


def grade_math(response: str | None, label) -> float:
    """slime's `math` reward: 1.0 if the last `\\boxed{}` of `response` matches `label` (MATH
    normalisation, then sympy in a bounded worker; see `math_grader`), else 0.0."""
    return 1.0 if grade_answer_verl(response, label) else 0.0


# ---------------------------------------------------------------------------------------------
# slime's sympy-side helpers (DeepScaleR's), on the same code `grade_answer_sympy` runs

# integers sympy reads as integers: Python refuses a leading 0 (`007`), so slime's parse fails there
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,29})")


def count_unknown_letters_in_expr(expr: str) -> int:
    """slime's `count_unknown_letters_in_expr`: how many distinct letters `expr` has once the
    words `sqrt` and `frac` are taken out (the unknowns sympy would have to handle)."""
    return len({c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """slime's `should_allow_eval`: whether `expr` may be handed to sympy: at most two unknown
    letters, no `^{` or `^(`, and no power of two or more digits or stacked `^n^`."""
    return _may_evaluate(expr)


def split_tuple(expr: str) -> list[str]:
    """slime's `split_tuple`: the elements of a tuple or interval such as `(1,2]` (brackets at both
    ends and none inside), stripped; anything else is one element; `""` is none. Thousands
    separators (`1,000`) are removed first, so they do not split."""
    return _split_tuple(expr)


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    """slime's `are_equal_under_sympy`: whether sympy simplifies `(truth)-(given)` to 0, for
    already-normalised answers; False if `should_allow_eval` refuses it or sympy cannot parse it.

    Bounded, unlike slime's: sympy runs in a `grader_pool` worker after the answer screen, and a
    refused or timed-out evaluation is False (a policy's answer can make sympy run for ever)."""
    truth, given = str(ground_truth_normalized), str(given_normalized)
    if not should_allow_eval(f"({truth})-({given})"):
        return False
    if _PLAIN_INT.fullmatch(truth) and _PLAIN_INT.fullmatch(given):
        return int(truth) == int(given)  # what sympy's difference says, without a worker
    return bool(
        grader_pool.run_screened(
            _sympy_equal, truth, given, timeout=grader_pool.DEFAULT_TIMEOUT_S, refused_value=False
        )[0]
    )


__all__ = [
    "extract_boxed_answer",
    "normalize_answer",
    "to_number",
    "is_equiv",
    "grade_math",
    # slime's names
    "extract_answer",
    "grade_answer_verl",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "last_boxed_only_string",
    "remove_boxed",
    "mathd_normalize_answer",
    "are_equal_under_sympy",
    "count_unknown_letters_in_expr",
    "should_allow_eval",
    "split_tuple",
]
