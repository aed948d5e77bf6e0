"""Hooks written as a slime user writes them: slime's imports, slime's signatures, nothing of
slime-rl's own API. Each leaves a line in `<run dir>/hook_calls.jsonl` (they run in Ray actors)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from slime.rollout.filter_hub.base_types import DynamicFilterOutput, call_dynamic_filter
from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.types import Sample


def _note(args, **record) -> None:
    with open(Path(args.run_dir) / "hook_calls.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **record}) + "\n")


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """slime's custom-generate pattern: the router URL from args, token ids in, log-probs out."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt = sample.prompt
    if isinstance(prompt, list):  # chat messages: the template as slime's default generate applies it
        prompt = state.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = state.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    output = await post(url, {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True})
    meta = output["meta_info"]
    response_ids = [item[1] for item in meta["output_token_logprobs"]]
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.response = output["text"]
    sample.rollout_log_probs = [item[0] for item in meta["output_token_logprobs"]]
    # the conversation's loss mask as slime's multi-turn SFT code computes it: only the assistant turn
    messages = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": sample.prompt}]
    generator = MultiTurnLossMaskGenerator(state.tokenizer, tokenizer_type="qwen")
    _, conversation_mask = generator.get_loss_mask(messages + [{"role": "assistant", "content": output["text"]}])
    sample.loss_mask = [1] * sample.response_length
    sample.status = Sample.Status.TRUNCATED if meta["finish_reason"]["type"] == "length" else Sample.Status.COMPLETED
    _note(args, hook="generate", assistant_mask_tokens=sum(conversation_mask), total=len(conversation_mask))
    return sample


def dynamic_filter(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Wraps slime's own filter through call_dynamic_filter; keeps a flat group when short of groups."""
    out = call_dynamic_filter(check_reward_nonzero_std, args, samples, **kwargs)
    _note(args, hook="filter", keep=out.keep)
    return DynamicFilterOutput(keep=out.keep, reason=out.reason, keep_when_insufficient=True)


def convert_samples_to_train_data(args, samples: list[Sample]) -> dict:
    """slime's convert hook: (args, samples) -> the train columns."""
    rewards = [s.get_reward_value(args) for s in samples]
    _note(args, hook="convert", n=len(samples))
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": rewards,
        "raw_reward": rewards,
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
        "loss_masks": [s.loss_mask for s in samples],
        "sample_indices": [s.index for s in samples],
    }
