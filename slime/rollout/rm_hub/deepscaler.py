"""slime's `deepscaler` reward: 1 if the boxed answer AFTER the reasoning is right, else 0.

Only the text after the last `</think>` (or after the first `###Response`) is graded; a response
with neither scores 0. The label may itself be boxed. slime's name for it is
`get_deepscaler_rule_based_reward`. Grading is `math_grader.grade_answer` (bounded: a refused or
timed-out grade is 0; `deepscaler_reward_checked` also returns the reason).
"""

from __future__ import annotations

from slime.rollout.rm_hub.math_grader import extract_answer, grade_answer_checked


def deepscaler_reward_checked(response: str, label, timeout: float | None = None) -> tuple[int, str | None]:
    """(the reward, None), or (0, the reason the grade was refused)."""
    response = response or ""
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0, None
    given = extract_answer(solution)
    if given is None or label == "":
        return 0, None
    if not isinstance(label, (str, int, float)):
        raise TypeError(f"deepscaler: the label must be a string or a number, got {type(label).__name__}")
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return 0, None
    ok, reason = grade_answer_checked(given, truth, timeout)
    return (1 if ok else 0), reason


def deepscaler_reward(response: str, label) -> int:
    return deepscaler_reward_checked(response, label)[0]


get_deepscaler_rule_based_reward = deepscaler_reward  # slime's name
