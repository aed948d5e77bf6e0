"""slime's on-policy distillation hooks for `--use-opd --opd-type sglang`: a teacher served by an
engine scores the student's own tokens.

    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
    --rm-url http://<teacher engine or router>/generate
      (or, instead: a frozen model named `teacher` in --sglang-config; its router is asked)

`reward_func` asks the teacher for the log-prob of every token of prompt + response (no new
tokens, log-probs from the first position, at `--rollout-temperature`) and keeps its answer as
the sample's reward. `post_process_rewards` turns that answer into `sample.teacher_log_probs` (one
per response token; the OPD term of the advantages reads them) and gives every sample a task
reward of 0.0: the learning signal is the distillation term alone, as in slime. A teacher that
fails marks the sample FAILED (the reward path's rule), never a silent zero.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from slime.errors import SlimeError
from slime.rollout.generation import get_model_url
from slime.utils.http_utils import post
from slime.utils.types import Sample

TEACHER = "teacher"  # the --sglang-config model the hooks ask when --rm-url is not given


def teacher_url(args: Namespace) -> str:
    """`--rm-url` (slime's way: a teacher server of its own), else the router of the model named
    `teacher` in --sglang-config (known only once the rollout manager has started it)."""
    if args.rm_url:
        return args.rm_url
    if TEACHER in (getattr(args, "sglang_model_routers", None) or {}):
        return get_model_url(args, TEACHER, "/generate")
    raise SlimeError(
        "slime.rollout.on_policy_distillation.reward_func needs --rm-url (the teacher's /generate) or a "
        f"model named {TEACHER!r} with update_weights: false in --sglang-config"
    )


async def reward_func(args: Namespace, sample: Sample, **kwargs: Any) -> dict[str, Any]:
    """The teacher engine's answer for prompt + response: its `meta_info.input_token_logprobs`."""
    url = teacher_url(args)
    payload = {
        "input_ids": list(sample.tokens),
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    return await post(url, payload)


def teacher_log_probs(answer: dict[str, Any], response_length: int) -> list[float]:
    """The response tokens' log-probs in a teacher answer (the first prompt token has none)."""
    per_token = answer["meta_info"]["input_token_logprobs"][1:]
    values = [float(item[0]) for item in per_token]
    if len(values) < response_length:
        raise SlimeError(f"the teacher returned {len(values)} log-probs for a response of {response_length} tokens")
    return values[len(values) - response_length :] if response_length else []


def post_process_rewards(args: Namespace, samples: list[Sample], **kwargs: Any) -> tuple[list[float], list[float]]:
    """`--custom-reward-post-process-path`: teacher log-probs into each sample, task rewards of 0."""
    for sample in samples:
        if isinstance(sample.reward, dict) and "meta_info" in sample.reward:
            sample.teacher_log_probs = teacher_log_probs(sample.reward, sample.response_length)
            sample.reward = 0.0  # the teacher's answer was not a reward
        elif sample.status == Sample.Status.FAILED:  # never trained on (zero loss mask); keeps the column whole
            sample.teacher_log_probs = [0.0] * sample.response_length
        elif sample.teacher_log_probs is None:  # (already read: a second call changes nothing)
            raise SlimeError(
                f"sample {sample.index}: no teacher answer to read log-probs from (is --custom-rm-path "
                f"slime.rollout.on_policy_distillation.reward_func?)"
            )
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
