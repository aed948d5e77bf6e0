"""slime's `math` / `deepscaler` grading: Hendrycks (MATH) string normalisation, then a sympy check.

The semantics are slime's (`grade_answer_verl`, which slime took from DeepScaleR): the answer is
the content of the last `\\boxed{...}`; it is right when it equals the label after the MATH
normalisation, or when both sides, normalised again and parsed by sympy, differ by zero — with
slime's guards: unreduced fractions must match as written, an integer label needs an integer
answer, tuples/intervals compare element-wise with matching brackets, and expressions with more
than two unknown letters or large powers are never evaluated. Written for this project from
those rules (`tests/rollout/test_rm_types.py` holds the cases); only `pylatexenc` (LaTeX to text)
and `sympy` are used, as slime does.

Quirks kept on purpose, so a slime user's numbers do not move: a falsy label (`""`, `0`, None)
scores 0; `\\boxed 5` (no braces) and `\\fbox{}` are not answers; `0.5` becomes `\\frac{1}{2}`.

Bounded (the policy is an adversary: `\\boxed{9**9**9}` hung slime's grader for good): the string
checks run in the caller, on answers of at most `MAX_ANSWER_CHARS`; the sympy part runs in a
`grader_pool` worker with a time limit, after `answer_screen` has refused answers whose
evaluation would not end (huge powers, factorials, towers). A grade that is refused or runs over
scores 0; the `*_checked` functions also return the reason (`async_rm` records it).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from pylatexenc import latex2text

from slime.rollout.rm_hub import grader_pool
from slime.rollout.rm_hub.answer_screen import MAX_ANSWER_CHARS, screen_answer
from slime.rollout.rm_hub.grader_pool import GradeRefused

_SYMPY_PARSE = None


def _sympy():
    global _SYMPY_PARSE
    if _SYMPY_PARSE is None:
        import sympy  # lazily: 0.4 s to import, and most answers are settled without it
        from sympy.parsing import sympy_parser

        transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
        _SYMPY_PARSE = (sympy, sympy_parser, transformations)
    return _SYMPY_PARSE


# ---------------------------------------------------------------------------------------------
# extraction


def last_boxed(text: str) -> str | None:
    """`\\boxed{...}` (whole, braces balanced) of the last `\\boxed` in `text` (else last `\\fbox`)."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : i + 1]
    return None


def strip_boxed(s: str | None) -> str | None:
    prefix = "\\boxed{"
    if not s or not s.startswith(prefix) or not s.endswith("}"):
        return None
    return s[len(prefix) : -1]


def extract_answer(passage: str | None) -> str | None:
    """slime's `extract_answer`: the last boxed content, only when the text has a `\\boxed`."""
    if not passage or "\\boxed" not in passage:
        return None
    return strip_boxed(last_boxed(passage))


# ---------------------------------------------------------------------------------------------
# MATH (Hendrycks) normalisation: exact string comparison after it


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":  # IndexError on "\\frac" at the end: caught by the caller, as slime's
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}{" + b + "}" + rest if b != "{" else "{" + a + "}" + b + rest
    return out


def _fix_slash(s: str) -> str:
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _drop_right_units(s: str) -> str:
    if "\\text{ " not in s:
        return s
    pieces = s.split("\\text{ ")
    if len(pieces) != 2:
        raise ValueError("more than one unit")
    return pieces[0]


def _fix_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    pieces = s.split("\\sqrt")
    out = pieces[0]
    for piece in pieces[1:]:
        out += ("\\sqrt{" + piece[0] + "}" + piece[1:]) if piece[0] != "{" else "\\sqrt" + piece
    return out


def _hendrycks_strip(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _drop_right_units(s)
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5" -> "5"
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


_TEXT_ONLY = re.compile(r"^\\text\{(?P<text>.+?)\}$")


def mathd_normalize(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = _TEXT_ONLY.search(answer)
        if m is not None:
            answer = m.group("text").strip()
        return _hendrycks_strip(answer)
    except (ValueError, IndexError):  # more than one unit, a trailing \frac or \sqrt: kept as it is
        return answer


def grade_mathd(given: str | None, truth: str | None) -> bool:
    return mathd_normalize(truth) == mathd_normalize(given)


# ---------------------------------------------------------------------------------------------
# sympy comparison

_UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_UNIT_RES = [re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]
_THOUSANDS_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRAC_RE = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _is_int_value(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _strip_thousands(expr: str) -> str:
    while True:
        nxt = _THOUSANDS_COMMA.sub(r"\1\3\4", expr)
        if nxt == expr:
            return nxt
        expr = nxt


def _str_is_int(s: str) -> bool:
    try:
        return _is_int_value(float(_strip_thousands(s)))
    except ValueError:
        return False


def _latex_to_text(expr: str) -> str:
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # mixed numbers: 1\frac{1}{2}
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for a, b in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(a, b)
    return expr.strip()


def sympy_normalize(expr: str | None) -> str | None:
    if expr is None:
        return None
    m = _TEXT_ONLY.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit_re in _UNIT_RES:
        expr = unit_re.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int_value(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # noqa: BLE001 - pylatexenc fails in many ways on malformed LaTeX: the text stays
            pass
    expr = re.sub("- *", "-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_evaluate(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(r.search(expr) for r in _BAD_REGEXES)


def _same_number(a: str, b: str) -> bool:
    try:
        return Decimal(_strip_thousands(a)) == Decimal(_strip_thousands(b))
    except InvalidOperation:
        return _sympy_equal(a, b)


def _sympy_equal(truth: str, given: str) -> bool:
    expr = f"({truth})-({given})"
    if not _may_evaluate(expr):
        return False
    reason = screen_answer(expr)  # again on the normalised text that sympy will read
    if reason is not None:
        raise GradeRefused(reason)
    try:
        sympy, parser, transformations = _sympy()
        diff = parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
        return sympy.simplify(diff) == 0
    except MemoryError:  # the worker's limit: a refused grade (with its reason), not a verdict
        raise
    except Exception:  # noqa: BLE001 - sympy fails in many ways: unparsable text is simply "not equal", as in slime
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if not expr:
        return []
    if len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS and all(c not in expr[1:-1] for c in _BRACKETS):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def _grade_sympy_unbounded(given: str | None, truth: str | None) -> bool:
    """slime's sympy check. Unbounded in time: runs in a grader worker (`grade_sympy_checked`)."""
    t, g = sympy_normalize(truth), sympy_normalize(given)
    if t is None or g is None:
        return False
    if t == g:
        return True
    if not g:
        return False
    t_elems, g_elems = _split_tuple(t), _split_tuple(g)
    if len(t_elems) > 1 and (t[0] != g[0] or t[-1] != g[-1]):
        return False
    if len(t_elems) != len(g_elems):
        return False
    for te, ge in zip(t_elems, g_elems, strict=True):
        if _FRAC_RE.search(te) and _FRAC_RE.search(ge):
            ok = te == ge  # unreduced fractions are not accepted through simplification
        elif _str_is_int(te) != _str_is_int(ge):
            ok = False  # an integer label needs an integer answer
        elif _str_is_int(te):
            ok = _same_number(te, ge)  # exact, as sympy's difference would be, without parsing
        else:
            ok = _sympy_equal(te, ge)
        if not ok:
            return False
    return True


_PLAIN_INT = re.compile(r"-?[0-9]{1,30}")


def grade_sympy_checked(given: str | None, truth: str | None, timeout: float | None = None) -> tuple[bool, str | None]:
    """(the sympy check, None), or (False, why it was refused): screened, timed out, worker died."""
    if given is None or truth is None:
        return False, None
    if _PLAIN_INT.fullmatch(given) and _PLAIN_INT.fullmatch(truth):
        return _grade_sympy_unbounded(given, truth), None  # integers compare as Decimals: no sympy, no worker
    return grader_pool.run_screened(_grade_sympy_unbounded, given, truth, timeout=timeout, refused_value=False)


def grade_sympy(given: str | None, truth: str | None) -> bool:
    """slime's grade_answer_sympy, bounded (a refused grade is False)."""
    return grade_sympy_checked(given, truth)[0]


def grade_answer_checked(given: str | None, truth: str | None, timeout: float | None = None) -> tuple[bool, str | None]:
    """(grade_answer's result, None), or (False, the reason it was refused)."""
    if given is not None and len(given) > MAX_ANSWER_CHARS and given != truth:
        return False, grader_pool.refused(GradeRefused(screen_answer(given) or "answer too long"))
    if grade_mathd(given, truth):
        return True, None
    return grade_sympy_checked(given, truth, timeout)


def grade_answer(given: str | None, truth: str | None) -> bool:
    """MATH-normalised equality, else the sympy check (slime's grade_answer_mathd or _sympy)."""
    return grade_answer_checked(given, truth)[0]


def grade_answer_verl_checked(solution: str | None, label, timeout: float | None = None) -> tuple[bool, str | None]:
    """(grade_answer_verl's result, None), or (False, the reason the grade was refused)."""
    if not label:
        return False, None
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
    given = extract_answer(solution or "")
    if given is None:
        return False, None
    return grade_answer_checked(given, truth, timeout)


def grade_answer_verl(solution: str | None, label) -> bool:
    """slime's `math` reward: the last boxed answer of `solution` against `label` (bounded: an
    answer refused or graded past `grader_pool.DEFAULT_TIMEOUT_S` is False)."""
    return grade_answer_verl_checked(solution, label)[0]
