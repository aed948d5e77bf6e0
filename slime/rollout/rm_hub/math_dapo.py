"""slime's `dapo` reward (DAPO / Minerva answer checking): `{score: 1.0 | -1.0, acc, pred}`.

Only the last 300 characters of the response are read; the answer is the last `Answer: ...`
line there (case-insensitive), normalised the Minerva way (units and formatting words dropped,
`\\text{}`/`\\boxed{}` unwrapped, `\\frac12` -> `\\frac{1}{2}`, thousands commas removed) and
compared as a string with the label, which must be a number (it is read as `int(float(label))`,
as DAPO's data are integers; a non-numeric label is an error, not a 0).
"""

from __future__ import annotations

import re

_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# (before, after) replacements, then removals, applied in this order.
_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>",
)


def normalize_final_answer(answer) -> str:
    s = str(answer).split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def compute_score(response: str, label) -> dict:
    """`{"score": 1.0 or -1.0, "acc": bool, "pred": normalised answer or "[INVALID]"}`."""
    tail = (response or "")[-300:]
    found = _ANSWER_RE.findall(tail)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    truth = str(int(float(normalize_final_answer(label))))
    correct = pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
