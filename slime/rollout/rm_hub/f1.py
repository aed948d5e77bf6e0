"""slime's `f1` reward: SQuAD/HotpotQA token F1 between response and label (the F1 only)."""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = set(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop articles (a, an, the), collapse whitespace."""
    s = "".join(c for c in str(s).lower() if c not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction, ground_truth) -> tuple[float, float, float]:
    """(f1, precision, recall); yes/no/noanswer must match exactly."""
    pred = normalize_answer(prediction if prediction is not None else "")
    truth = normalize_answer(ground_truth if ground_truth is not None else "")
    if (pred in _SPECIAL or truth in _SPECIAL) and pred != truth:
        return 0, 0, 0
    pred_tokens, truth_tokens = pred.split(), truth.split()
    same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if same == 0:
        return 0, 0, 0
    precision, recall = same / len(pred_tokens), same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall
