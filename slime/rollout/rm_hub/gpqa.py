"""slime's `gpqa` reward: multiple choice, 1.0 if the chosen option is the right one, else 0.0.

The text after the last `</think>` is read. The right option comes from `metadata["correct_letter"]`,
else a one-letter label, else an integer label (an index), else the label text matched against
`metadata["choices"]`. The chosen letter is the first of "answer/option/choice [is|:] X",
"X is (the) correct", "final answer X", else the last standalone valid capital letter. Without a
usable letter on both sides, the response scores when it contains the right option's text.
"""

from __future__ import annotations

import re
import string

DEFAULT_VALID_LETTERS = list(string.ascii_uppercase[:10])
# Possessive `\s*+`: the same matches as `\s*` here (what follows a run of spaces never is one),
# but linear time; with `\s*(?:is|:)?\s*`, "answer" and 40,000 spaces took 17 s on the event loop.
_LETTER_PATTERNS = (
    re.compile(r"(?:answer|option|choice)\s*+(?:is|:)?\s*+([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*+(?:is\s*+(?:the)?\s*+correct)", re.IGNORECASE),
    re.compile(r"final\s*+(?:answer|option)\s*+(?:is|:)?\s*+([A-Z])", re.IGNORECASE),
)


def _after_thinking(text: str) -> str:
    if not text:
        return ""
    return text.rsplit("</think>", 1)[-1] if "</think>" in text else text


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def extract_letter(response: str, valid_letters) -> str | None:
    if not response:
        return None
    text = _after_thinking(response)
    valid = {v.upper() for v in valid_letters}
    for pattern in _LETTER_PATTERNS:
        m = pattern.search(text)
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None


def gpqa_reward(response: str, label, metadata: dict | None = None) -> float:
    if response is None:
        return 0.0
    metadata = metadata if metadata is not None else {}
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        choices = list(choices.values())
    elif choices is not None:
        choices = list(choices)

    valid = metadata.get("valid_letters")
    if valid:
        valid = [str(v).upper() for v in valid]
    elif choices:
        valid = list(string.ascii_uppercase[: len(choices)])
    else:
        valid = DEFAULT_VALID_LETTERS

    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None

    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in valid and not correct:
            correct = label_text.upper()
    elif isinstance(label, (int, float)):
        idx = int(label)
        if 0 <= idx < len(valid):
            correct = valid[idx]

    if not correct and choices and label_text:
        target = _norm(label_text)
        for idx, choice in enumerate(choices):
            if _norm(str(choice)) == target:
                correct = valid[idx]
                metadata.setdefault("correct_answer", choice)
                break

    chosen = extract_letter(response, valid)
    if chosen and correct:
        return 1.0 if chosen == correct else 0.0

    candidates = []
    if correct and choices and correct in valid:
        idx = valid.index(correct)
        if idx < len(choices):
            candidates.append(str(choices[idx]))
    for key in ("correct_answer", "answer_text"):
        if metadata.get(key):
            candidates.append(str(metadata[key]))
    if label_text and not (len(label_text) == 1 and label_text.upper() in valid):
        candidates.append(label_text)
    haystack = f" {_norm(_after_thinking(response))} "
    if any(t and f" {t} " in haystack for t in {_norm(c) for c in candidates if c}):
        return 1.0
    if chosen and not correct and label_text:
        return 1.0 if chosen == label_text.strip().upper() else 0.0
    return 0.0


compute_gpqa_reward = gpqa_reward  # slime's name
