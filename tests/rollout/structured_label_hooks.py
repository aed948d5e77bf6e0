"""Hooks in the shape of slime's search-r1 example (examples/search-r1): the label is an object and
the reward reads `sample.label["ground_truth"]["target"]` (loaded by dotted path, as a user's are)."""

import re
import string

from slime.utils.types import Sample


def _normalize(text: str) -> str:
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


async def answer_generate(args, sample: Sample, sampling_params: dict) -> Sample:
    """Stands in for the engine: answers what the row's metadata says the policy would answer."""
    sample.response = f"<answer> {sample.metadata['policy_answer']} </answer>"
    sample.tokens, sample.response_length, sample.loss_mask = [1, 2, 3], 2, [1, 1]
    sample.status = Sample.Status.COMPLETED
    return sample


async def search_r1_reward(args, sample: Sample, **kwargs) -> float:
    """Exact match of the <answer> against any of the label's targets (search-r1's EM score)."""
    match = re.search(r"<answer>(.*?)</answer>", sample.response, re.DOTALL)
    if match is None:
        return 0.0
    targets = sample.label["ground_truth"]["target"]
    return 1.0 if _normalize(match.group(1)) in {_normalize(t) for t in targets} else 0.0
