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
import inspect
import logging
import traceback
from argparse import Namespace
from typing import Any

from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
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


def _mark_failed(sample: Sample, where: str, error: BaseException) -> None:
    """A hook or reward that raised: the sample is FAILED (kept, never trained on), with the reason."""
    sample.status = Sample.Status.FAILED
    sample.metadata["error"] = f"{where}: {type(error).__name__}: {error}"
    sample.metadata["traceback"] = traceback.format_exc()


def _ensure_tokens(state: GenerateState, sample: Sample) -> None:
    """Keep a failed sample well-formed (it is never trained on): prompt tokens, a matching mask."""
    if not sample.tokens:
        sample.tokens, sample.response_length, sample.loss_mask = _prompt_ids(state, sample), 0, []
    if sample.loss_mask is None or len(sample.loss_mask) != sample.response_length:
        sample.loss_mask = [0] * sample.response_length


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _reward(args: Namespace, samples: list[Sample]) -> None:
    """Score what needs a score: one call per sample, or one per group with `--group-rm`.

    A reward a custom generate function already set is kept (slime's rule). A reward function
    that raises marks that sample FAILED with the traceback logged; the others are still scored.
    """
    todo = [s for s in samples if s.status not in (Sample.Status.FAILED, Sample.Status.ABORTED)]
    if getattr(args, "group_rm", False):
        if not todo:
            return
        try:
            rewards = list(await batched_async_rm(args, todo))
            if len(rewards) != len(todo):
                raise ValueError(f"returned {len(rewards)} rewards for a group of {len(todo)} samples")
        except Exception as e:
            logger.exception("group reward failed for group %s", todo[0].group_index)
            for s in todo:
                _mark_failed(s, "reward (--group-rm)", e)
            return
        for s, r in zip(todo, rewards):
            s.reward = r
        return

    async def one(s: Sample) -> None:
        try:
            s.reward = await async_rm(args, s)
        except Exception as e:
            logger.exception("reward failed for sample %s", s.index)
            _mark_failed(s, "reward", e)

    await asyncio.gather(*(one(s) for s in todo if s.reward is None))


async def _custom_generate_one(args: Namespace, sample: Sample, sampling_params: dict[str, Any],
                               evaluation: bool) -> list[Sample]:
    """One call of the --custom-generate-function-path hook; its exception fails only this sample."""
    state = GenerateState(args)
    fn = state.custom_generate
    try:
        if "evaluation" in inspect.signature(fn).parameters:
            result = await _maybe_await(fn(args, sample, sampling_params, evaluation=evaluation))
        else:
            result = await _maybe_await(fn(args, sample, sampling_params))
        results = result if isinstance(result, list) else [result]
        if not results or not all(isinstance(r, Sample) for r in results):
            raise TypeError(f"returned {type(result).__name__}, not a Sample or a list of Samples")
        return results
    except Exception as e:
        logger.exception("--custom-generate-function-path %s failed for sample %s",
                         args.custom_generate_function_path, sample.index)
        _mark_failed(sample, f"--custom-generate-function-path {args.custom_generate_function_path}", e)
        _ensure_tokens(state, sample)
        return [sample]


async def generate_and_rm_group(
    args: Namespace, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample]:
    """Generate every sample of a group, then score them. A failure marks samples FAILED."""
    state = GenerateState(args)
    async with state.semaphore:
        if state.custom_generate is None:
            try:
                await _generate_group_batched(args, group, sampling_params)
            except Exception as e:  # one bad group must not kill the rollout; it is marked and counted
                logger.exception("generate failed for group %s", group[0].group_index)
                for s in group:
                    _mark_failed(s, "generate", e)
                    _ensure_tokens(state, s)
        else:
            results = await asyncio.gather(
                *(_custom_generate_one(args, s, copy.deepcopy(sampling_params), evaluation) for s in group)
            )
            group[:] = [r for res in results for r in res]
    await _reward(args, group)
    return group


async def _dynamic_filter(args: Namespace, fn: Any, group: list[Sample]) -> tuple[bool, str | None]:
    """slime's dynamic-sampling contract: fn(args, samples) -> bool or DynamicFilterOutput(keep, reason)."""
    try:
        out = await _maybe_await(fn(args, group))
    except Exception as e:
        raise SlimeError(f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} raised "
                         f"{type(e).__name__}: {e}") from e
    if isinstance(out, DynamicFilterOutput):
        return bool(out.keep), out.reason
    return bool(out), None


async def generate_rollout_async(args: Namespace, rollout_id: int, data_source: Any) -> RolloutFnTrainOutput:
    """`--rollout-batch-size` groups; with `--dynamic-sampling-filter-path`, groups the filter drops
    are replaced by new prompts, fetched `--over-sampling-batch-size` at a time."""
    state = GenerateState(args)
    filter_path = getattr(args, "dynamic_sampling_filter_path", None)
    if not filter_path:
        groups = data_source.get_samples(args.rollout_batch_size)
        tasks = [generate_and_rm_group(args, g, state.sampling_params) for g in groups]
        return RolloutFnTrainOutput(samples=list(await asyncio.gather(*tasks)))

    fn = load_function(filter_path, arg_name="--dynamic-sampling-filter-path")
    target = args.rollout_batch_size
    batch = getattr(args, "over_sampling_batch_size", None) or target
    budget = getattr(args, "dynamic_sampling_max_groups", None) or 10 * target
    kept: list[list[Sample]] = []
    drops: dict[str, int] = {}
    generated = 0
    while len(kept) < target:
        if generated >= budget:
            raise SlimeError(
                f"rollout {rollout_id}: --dynamic-sampling-filter-path {filter_path} kept {len(kept)} of "
                f"{generated} groups, fewer than --rollout-batch-size {target} (drops: {drops or 'no reason given'})"
            )
        groups = data_source.get_samples(batch)
        generated += len(groups)
        done = await asyncio.gather(*(generate_and_rm_group(args, g, state.sampling_params) for g in groups))
        for group in done:
            keep, reason = await _dynamic_filter(args, fn, group)
            if keep and len(kept) < target:
                kept.append(group)
            elif not keep:
                key = reason or "unspecified"
                drops[key] = drops.get(key, 0) + 1
    metrics = {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
    metrics["rollout/dynamic_filter/generated_groups"] = float(generated)
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


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
