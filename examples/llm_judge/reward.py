"""A reward from a frozen judge model served by the same run (`--sglang-config`'s `judge`).

    --sglang-config examples/llm_judge/sglang_config.yaml
    --custom-rm-path examples.llm_judge.reward.judge_reward

The judge is asked a yes/no question about the policy's answer, and the reward is the judge's
probability of " yes" against " no" as the continuation of that question, read from its
log-probs (`/generate` with no new tokens). Nothing the judge writes is parsed, so the policy
cannot win by making the judge print a high score, and the reward is bounded to [0, 1]. The
policy's answer is cut to fit the judge's context and stripped of the markers that frame it.
An unreachable judge, a malformed answer or a non-finite log-prob raises: the sample is marked
FAILED (never trained on, counted in `rollout/status/failed`), never given a free reward.

What this does not stop: the answer is text the judge reads, so an answer written to persuade the
judge (prompt injection) can still raise its verdict. RL finds such answers when they pay; watch
the judge's reward against a rule-based evaluation on held-out data (`--eval-prompt-data` with a
rule-based `--eval-config` reward).
"""

from __future__ import annotations

import functools
import math
from argparse import Namespace
from typing import Any

from slime.errors import SlimeError
from slime.rollout.sglang_rollout import get_model_url
from slime.utils.http_utils import get, post
from slime.utils.types import Sample

JUDGE = "judge"  # the model's name in --sglang-config
VERDICTS = (" yes", " no")
OPEN, CLOSE = "<answer>", "</answer>"
HEAD = "You grade answers. Question: {question}\nReference: {reference}\nCandidate {open}"
TAIL = "{close}\nIs the candidate correct? Answer yes or no. Verdict:"


@functools.lru_cache(maxsize=4)
def judge_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


async def judge_info(args: Namespace) -> dict[str, Any]:
    """The judge's checkpoint and context length (its router answers for its engines)."""
    info = await get(get_model_url(args, JUDGE, "/get_model_info"))
    if not isinstance(info, dict) or not info.get("model_path") or not info.get("context_length"):
        raise SlimeError(f"the judge's /get_model_info answered without model_path/context_length: {info!r}")
    return info


def judge_prompt_ids(tok: Any, sample: Sample, context_length: int) -> tuple[list[int], list[list[int]]]:
    """(the question's token ids, each verdict's ids); the answer is cut so both fit the context."""
    question = sample.prompt if isinstance(sample.prompt, str) else str(sample.prompt)
    answer = (sample.response or "").replace(OPEN, "").replace(CLOSE, "")
    head = tok.encode(HEAD.format(question=question, reference=sample.label or "", open=OPEN), add_special_tokens=False)
    tail = tok.encode(TAIL.format(close=CLOSE), add_special_tokens=False)
    verdicts = [tok.encode(v, add_special_tokens=False) for v in VERDICTS]
    room = context_length - len(head) - len(tail) - max(map(len, verdicts)) - 1
    if room <= 0:
        raise SlimeError(
            f"the judge's context ({context_length} tokens) cannot hold the question of sample {sample.index}"
        )
    body = tok.encode(answer, add_special_tokens=False)[:room]
    return head + body + tail, verdicts


def verdict_logprob(answer: Any, length: int) -> float:
    """The summed log-prob of a verdict's `length` tokens in one `/generate` answer, checked."""
    try:
        values = [float(item[0]) for item in answer["meta_info"]["input_token_logprobs"][-length:]]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise SlimeError(f"the judge's answer has no usable input_token_logprobs: {e!r}") from e
    if len(values) != length or not all(math.isfinite(v) for v in values):
        raise SlimeError(f"the judge returned log-probs {values} for a {length}-token verdict")
    return sum(values)


def p_yes(yes: float, no: float) -> float:
    """P(yes) / (P(yes) + P(no)) from two log-probs, computed stably; always in [0, 1]."""
    top = max(yes, no)
    a, b = math.exp(yes - top), math.exp(no - top)
    return a / (a + b)


async def judge_reward(args: Namespace, sample: Sample, **kwargs: Any) -> float:
    info = await judge_info(args)
    tok = judge_tokenizer(info["model_path"])
    prompt, verdicts = judge_prompt_ids(tok, sample, int(info["context_length"]))
    payload = {
        "input_ids": [prompt + v for v in verdicts],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": len(prompt),
    }
    answers = await post(get_model_url(args, JUDGE, "/generate"), payload)
    if not isinstance(answers, list) or len(answers) != len(verdicts):
        raise SlimeError(f"the judge answered {type(answers).__name__} for a batch of {len(verdicts)}")
    yes, no = (verdict_logprob(a, len(v)) for a, v in zip(answers, verdicts, strict=True))
    return p_yes(yes, no)
