"""The default rollout: prompts -> engine `/generate` over HTTP -> rewards.

Same names and contracts as slime's `slime.rollout.sglang_rollout`:
* `generate_rollout(args, rollout_id, data_source, evaluation=False)` is the
  `--rollout-function-path` default; it returns a list of groups (lists of `Sample`), or, with
  `evaluation=True`, `{name: {"rewards": [...], "samples": [...]}}` per eval data set.
* `generate(args, sample, sampling_params)` is the default per-sample generate function; a
  `--custom-generate-function-path` hook has the same signature.
* `GenerateState` is the per-process singleton hooks use for `.tokenizer` and `.semaphore`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from argparse import Namespace
from typing import Any

from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.utils.async_utils import run
from slime.utils.http_utils import post, session_headers
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


class GenerateState:
    """Per-process state shared by every generate call (slime's singleton)."""

    _instance: "GenerateState | None" = None

    def __new__(cls, args: Namespace) -> "GenerateState":
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._setup(args)
            cls._instance = inst
        return cls._instance

    def _setup(self, args: Namespace) -> None:
        from transformers import AutoTokenizer

        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency * max(1, getattr(args, "num_engines", 1)))
        self.sampling_params = sampling_params_from_args(args, evaluation=False)
        self.custom_generate = (
            load_function(args.custom_generate_function_path, arg_name="--custom-generate-function-path")
            if args.custom_generate_function_path
            else None
        )
        self.custom_rm = (
            load_function(args.custom_rm_path, arg_name="--custom-rm-path") if args.custom_rm_path else None
        )
        self.eval_datasets: dict[str, list[Sample]] = {}

    @classmethod
    def reset(cls) -> None:
        cls._instance = None


def sampling_params_from_args(args: Namespace, *, evaluation: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": args.eval_temperature if evaluation else args.rollout_temperature,
        "top_p": args.eval_top_p if evaluation else args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.eval_max_response_len if evaluation else args.rollout_max_response_len,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def engine_url(args: Namespace, endpoint: str = "generate") -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/{endpoint}"


def _prompt_ids(state: GenerateState, sample: Sample) -> list[int]:
    if sample.tokens:
        return list(sample.tokens[: len(sample.tokens) - sample.response_length])
    if isinstance(sample.prompt, list):  # chat messages not yet templated
        return list(state.tokenizer.apply_chat_template(sample.prompt, add_generation_prompt=True, tokenize=True))
    return state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]


def _apply_output(sample: Sample, prompt_ids: list[int], output: dict[str, Any]) -> Sample:
    """Record one engine answer on the sample: tokens exactly as generated, log-probs, status."""
    meta = output["meta_info"]
    new_ids = list(output["output_ids"])
    sample.tokens = prompt_ids + new_ids
    sample.response = output["text"]
    sample.response_length = len(new_ids)
    sample.loss_mask = [1] * len(new_ids)
    logprobs = meta.get("output_token_logprobs")
    if logprobs is not None:
        sample.rollout_log_probs = [float(lp[0]) for lp in logprobs]
    finish = (meta.get("finish_reason") or {}).get("type")
    sample.status = {
        "length": Sample.Status.TRUNCATED,
        "abort": Sample.Status.ABORTED,
    }.get(finish, Sample.Status.COMPLETED)
    return sample


async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Default single-sample generate: one `/generate` call, token in, token out."""
    state = GenerateState(args)
    prompt_ids = _prompt_ids(state, sample)
    payload = {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True}
    output = await post(engine_url(args), payload, headers=session_headers(sample.session_id))
    return _apply_output(sample, prompt_ids, output)


async def _generate_group_batched(args: Namespace, group: list[Sample], sampling_params: dict[str, Any]) -> None:
    """The n samples of one prompt as one batch request: one HTTP round trip per group."""
    state = GenerateState(args)
    prompt_ids = _prompt_ids(state, group[0])
    payload = {
        "input_ids": [prompt_ids] * len(group),
        "sampling_params": dict(sampling_params),  # one dict for the batch: what sglang-router accepts too
        "return_logprob": True,
    }
    outputs = await post(engine_url(args), payload, headers=session_headers(group[0].session_id))
    for sample, output in zip(group, outputs):
        _apply_output(sample, prompt_ids, output)


async def _reward(args: Namespace, samples: list[Sample]) -> None:
    state = GenerateState(args)
    todo = [s for s in samples if s.status != Sample.Status.FAILED]
    if state.custom_rm is not None:
        rewards = await asyncio.gather(*(state.custom_rm(args, s) for s in todo))
    else:
        rewards = await batched_async_rm(args, todo)
    for s, r in zip(todo, rewards):
        s.reward = r


async def generate_and_rm_group(
    args: Namespace, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample]:
    """Generate every sample of a group, then score them. A failure marks samples FAILED."""
    state = GenerateState(args)
    async with state.semaphore:
        try:
            if state.custom_generate is None:
                await _generate_group_batched(args, group, sampling_params)
            else:
                results = await asyncio.gather(
                    *(state.custom_generate(args, s, copy.deepcopy(sampling_params)) for s in group)
                )
                group[:] = [r for res in results for r in (res if isinstance(res, list) else [res])]
        except Exception as e:  # one bad group must not kill the rollout; it is marked and counted
            logger.exception("generate failed for group %s", group[0].group_index)
            for s in group:
                s.status = Sample.Status.FAILED
                s.metadata["error"] = f"{type(e).__name__}: {e}"
                if not s.tokens:  # keep the prompt so the sample stays well-formed (never trained on)
                    s.tokens, s.response_length, s.loss_mask = _prompt_ids(state, s), 0, []
    await _reward(args, group)
    return group


async def generate_rollout_async(args: Namespace, rollout_id: int, data_source: Any) -> list[list[Sample]]:
    state = GenerateState(args)
    groups = data_source.get_samples(args.rollout_batch_size)
    tasks = [generate_and_rm_group(args, g, state.sampling_params) for g in groups]
    return list(await asyncio.gather(*tasks))


def _eval_datasets(args: Namespace) -> dict[str, list[Sample]]:
    from slime.data.dataset import load_prompt_samples

    state = GenerateState(args)
    if not state.eval_datasets and args.eval_prompt_data:
        pairs = args.eval_prompt_data
        for name, path in zip(pairs[0::2], pairs[1::2]):
            state.eval_datasets[name] = load_prompt_samples(
                path,
                input_key=args.eval_input_key,
                label_key=args.eval_label_key,
                tokenizer=state.tokenizer,
                apply_chat_template=args.apply_chat_template,
                apply_chat_template_kwargs=args.apply_chat_template_kwargs,
            )
    return state.eval_datasets


async def eval_rollout_async(args: Namespace, rollout_id: int) -> dict[str, dict[str, Any]]:
    params = sampling_params_from_args(args, evaluation=True)
    results: dict[str, dict[str, Any]] = {}
    for name, prompts in _eval_datasets(args).items():
        groups = []
        for i, p in enumerate(prompts):
            groups.append([copy.deepcopy(p) for _ in range(args.n_samples_per_eval_prompt)])
            for j, s in enumerate(groups[-1]):
                s.group_index, s.index = i, i * args.n_samples_per_eval_prompt + j
        done = await asyncio.gather(*(generate_and_rm_group(args, g, params, evaluation=True) for g in groups))
        samples = [s for g in done for s in g]
        results[name] = {"rewards": [s.get_reward_value(args) for s in samples], "samples": samples}
    return results


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract (sync; runs on the process's background event loop)."""
    if evaluation:
        return run(eval_rollout_async(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))


__all__ = ["GenerateState", "generate", "generate_rollout", "generate_and_rm_group", "async_rm"]
