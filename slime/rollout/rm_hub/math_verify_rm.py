"""slime's `math_verify` reward: the last boxed answer against the label, checked by `math-verify`.

Both sides are parsed by math-verify (a bare answer is also tried wrapped in `$...$`; a purely
alphabetic one as a string answer); when both parse, math-verify decides; otherwise the answers
must match after lower-casing and collapsing whitespace. No label or no boxed answer: 0.0.
"""

from __future__ import annotations

import logging
import re

from slime.rollout.rm_hub.math_grader import extract_answer

# math-verify warns "timeout is disabled" on every call made without its signal-based timeout
# (signals only work in the main thread; rewards run on the rollout's event-loop thread).
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parse(raw: str):
    from math_verify import StringExtractionConfig, parse  # lazily: 0.8 s to import, only for this --rm-type

    raw = str(raw).strip()
    if not raw:
        return []
    candidates = [raw] if raw.startswith("$") and raw.endswith("$") else [raw, f"${raw}$"]
    extra = {"extraction_config": [StringExtractionConfig()]} if re.fullmatch(r"[A-Za-z]+", raw) else {}
    for candidate in candidates:
        parsed = parse(candidate, parsing_timeout=None, **extra)
        if parsed:
            return parsed
    return []


def _plain(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip()).lower()


def math_verify_reward(response: str, label) -> float:
    from math_verify import verify  # lazily, as in _parse

    if not label:
        return 0.0
    given = extract_answer(response or "")
    if given is None:
        return 0.0
    gold = str(label).strip()
    parsed_given, parsed_gold = _parse(given), _parse(gold)
    if parsed_given and parsed_gold:
        try:
            return 1.0 if verify(parsed_given, parsed_gold, timeout_seconds=None) else 0.0  # slime's argument order
        except Exception:
            pass
    return 1.0 if _plain(given) == _plain(gold) else 0.0
