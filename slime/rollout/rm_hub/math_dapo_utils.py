"""slime's module path for the DAPO scorer; the code is `slime.rollout.rm_hub.math_dapo`."""

from slime.rollout.rm_hub.math_dapo import (
    REMOVED_EXPRESSIONS,
    SUBSTITUTIONS,
    compute_score,
    is_correct_minerva,
    is_correct_strict_box,
    last_boxed_only_string,
    normalize_final_answer,
    remove_boxed,
    timeout,
    verify,
)

__all__ = [
    "REMOVED_EXPRESSIONS",
    "SUBSTITUTIONS",
    "compute_score",
    "is_correct_minerva",
    "is_correct_strict_box",
    "last_boxed_only_string",
    "normalize_final_answer",
    "remove_boxed",
    "timeout",
    "verify",
]
