"""Test-based reward for the coding agent (`--custom-rm-path examples.coding_agent.reward.reward`).

The answer graded is the last ```python block the model wrote itself, else the last program it
ran in `<code>...</code>`. Only the model's own tokens are read (the spans in
`metadata["turns"]`), never the tool output: a program that prints a fenced block cannot hand
the grader code the model did not write. Grading is the framework's `grade_code` (the
`--rm-type code` grader): the tests are `metadata["tests"]` or the label, either Python test code
run against the program by the token driver, or a list of {"input", "output"} stdin/stdout cases;
1.0 when all pass.
"""

from __future__ import annotations

import asyncio
import re
from argparse import Namespace
from typing import Any

from examples.coding_agent.generate import sandbox_limits, sandbox_slot
from slime.rollout.rm_hub.code import grade_code
from slime.utils.types import Sample

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CODE = re.compile(r"<code>(.*?)</code>", re.DOTALL)


def model_text(sample: Sample, tokenizer: Any) -> str:
    """The response with tool output left out: the model turns' tokens, decoded."""
    turns = sample.metadata.get("turns") if isinstance(sample.metadata, dict) else None
    if not turns:
        return sample.response or ""
    start = sample.prompt_length
    return "".join(
        tokenizer.decode(sample.tokens[start + t["start"] : start + t["end"]], skip_special_tokens=True)
        for t in turns
        if t["role"] == "model"
    )


def final_program(text: str) -> str | None:
    fenced = _FENCE.findall(text)
    if fenced:
        return fenced[-1].strip()
    ran = _CODE.findall(text)
    return ran[-1].strip() if ran else None


def tests_of(sample: Sample) -> Any:
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    tests = metadata.get("tests", sample.label)
    if not tests:
        raise ValueError("coding_agent reward: the sample has no tests (metadata['tests'] or the label)")
    return tests


async def reward(args: Namespace, sample: Sample) -> float:
    from slime.rollout.sglang_rollout import GenerateState

    tests = tests_of(sample)
    program = final_program(model_text(sample, GenerateState(args).tokenizer))
    if program is None:
        sample.metadata["code_result"] = "no program in the response"
        return 0.0

    def job() -> tuple[float, str]:
        with sandbox_slot(args):
            return grade_code(program, tests, sandbox_limits(args))

    score, reason = await asyncio.to_thread(job)
    sample.metadata["code_result"] = reason
    return score
