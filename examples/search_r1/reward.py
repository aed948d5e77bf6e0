"""Exact-match reward for the Search-R1 example (`--custom-rm-path examples.search_r1.reward.reward`).

1.0 when the content of the response's last `<answer>...</answer>` equals the label after
normalisation (lower case, no punctuation, no articles, single spaces), else 0.0. A label may
list several accepted answers separated by `|`. Retrieved passages never contain tags (the hook
strips angle brackets from them), so the answer tag found is always one the model wrote.
"""

from __future__ import annotations

import re
import string
from argparse import Namespace

from slime.utils.types import Sample

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(response: str) -> str | None:
    found = _ANSWER.findall(response or "")
    return found[-1] if found else None


def exact_match(response: str, label: str | None) -> float:
    answer = extract_answer(response)
    if answer is None or not label:
        return 0.0
    golds = {normalize(g) for g in str(label).split("|")} - {""}
    return 1.0 if normalize(answer) in golds else 0.0


async def reward(args: Namespace, sample: Sample) -> float:
    return exact_match(sample.response, sample.label)
