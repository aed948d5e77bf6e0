"""slime's `dapo` reward (DAPO / Minerva answer checking): `{score: 1.0 | -1.0, acc, pred}`.

Only the last 300 characters of the response are read (which also bounds the regex work on an
adversarial response). By default the answer is the last `Answer: ...` line there
(case-insensitive), normalised the Minerva way (units and formatting words dropped,
`\\text{}`/`\\boxed{}` unwrapped, `\\frac12` -> `\\frac{1}{2}`, thousands commas removed) and
compared as a string with the label, which must be a number (it is read as `int(float(label))`,
as DAPO's data are integers; a non-numeric label is an error, not a 0). With
`strict_box_verify=True` the answer is instead the last `\\boxed{}` in the final 100 characters
(or the 100 before the last pause token), compared verbatim with the label.

slime's module path for these is `slime.rollout.rm_hub.math_dapo_utils`.
"""

from __future__ import annotations

import re
import signal

_ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"
_BOX_OPEN = "\\boxed{"

# (before, after) replacements, then removals, applied in this order.
SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
]


def last_boxed_only_string(string: str) -> str | None:
    """The last `\\boxed{...}` of `string`, braces and all (None if there is none or it never closes)."""
    start = string.rfind(_BOX_OPEN)
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[start : i + 1]
    return None


def remove_boxed(s: str) -> str:
    """`\\boxed{X}` -> `X`; anything else is an AssertionError (as in slime)."""
    assert s[: len(_BOX_OPEN)] == _BOX_OPEN, f"box error: {s}"
    assert s[-1] == "}", f"box error: {s}"
    return s[len(_BOX_OPEN) : -1]


class timeout:
    """`with timeout(seconds):` raises TimeoutError when the block runs longer (SIGALRM: the main
    thread of a Unix process only). Kept for slime's name; the scorers here do not need it."""

    def __init__(self, seconds: int = 1, error_message: str = "Timeout"):
        self.seconds = seconds
        self.error_message = error_message

    def handle_timeout(self, signum, frame):
        raise TimeoutError(self.error_message)

    def __enter__(self):
        signal.signal(signal.SIGALRM, self.handle_timeout)
        signal.alarm(self.seconds)

    def __exit__(self, type, value, traceback):
        signal.alarm(0)


def normalize_final_answer(final_answer) -> str:
    """Minerva's normalisation of a final answer (the text after the last `=`)."""
    s = str(final_answer).split("=")[-1]
    for before, after in SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)  # \fracab -> \frac{a}{b}
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)  # \sqrta -> \sqrt{a}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def is_correct_minerva(
    solution_str: str, gt, gt_need_extract: bool = False, answer_pattern: str = _ANSWER_PATTERN
) -> tuple[bool, str]:
    """(the last `Answer:` of the solution equals the integer label after normalisation, the
    normalised prediction — "[INVALID]" when there is no `Answer:` line)."""
    found = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    truth = normalize_final_answer(remove_boxed(last_boxed_only_string(gt)) if gt_need_extract else gt)
    truth = str(int(float(truth)))  # DAPO's answers are integers
    return pred == truth, pred


def is_correct_strict_box(pred: str, gt, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    """(1 if the last boxed content of the answer's tail is exactly `gt` else -1, that content)."""
    if pause_tokens_index is not None:
        assert len(pause_tokens_index) == 4
        pred = pred[pause_tokens_index[-1] - 100 :]
    else:
        pred = pred[-100:]
    boxed = last_boxed_only_string(pred)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str, answer, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str | None]:
    """(correct, prediction) by the strict-box or the Minerva rule."""
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    return is_correct_minerva(solution_str, answer)


def compute_score(
    solution_str: str, ground_truth, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> dict:
    """`{"score": 1.0 or -1.0, "acc": bool, "pred": prediction}` of the last 300 characters."""
    tail = (solution_str or "")[-300:]  # MATH-500's longest answer has 159 characters
    correct, pred = verify(tail, ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
