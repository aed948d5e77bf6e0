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
import threading
import traceback
import weakref
from argparse import Namespace
from typing import Any

from transformers import AutoTokenizer

from slime.data.dataset import load_prompt_samples
from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.utils.async_utils import run
from slime.utils.http_utils import post, session_headers
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

DYNAMIC_SAMPLING_BUDGET = 10  # x the target: a dynamic-sampling filter that keeps less than 1 in 10 stops the run


class GenerateState:
    """Per-process state shared by every generate call (slime's singleton)."""

    _instance: "GenerateState | None" = None
    _lock = threading.Lock()

    def __new__(cls, args: Namespace) -> "GenerateState":
        with cls._lock:  # a hook's background thread and the rollout may both ask first
            if cls._instance is None:
                inst = super().__new__(cls)
                inst._setup(args)
                cls._instance = inst
        return cls._instance

    def _setup(self, args: Namespace) -> None:
        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.concurrency = args.sglang_server_concurrency * args.num_engines
        self._semaphores: "weakref.WeakKeyDictionary[Any, asyncio.Semaphore]" = weakref.WeakKeyDictionary()
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
        # Set while a rollout aborts its long tail: generate calls not yet sent return ABORTED.
        self.aborted = False

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """Bounds in-flight requests (`--sglang-server-concurrency` per engine). One per event loop:
        an asyncio semaphore belongs to one loop, and a hook may generate from its own thread's loop."""
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.concurrency)
        return sem

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


def prompt_ids_of(state: GenerateState, sample: Sample) -> list[int]:
    if sample.tokens:
        return list(sample.tokens[: len(sample.tokens) - sample.response_length])
    if isinstance(sample.prompt, list):  # chat messages not yet templated
        # rendered, then encoded: with tokenize=True transformers 5 returns a BatchEncoding, not ids
        text = state.tokenizer.apply_chat_template(sample.prompt, add_generation_prompt=True, tokenize=False,
                                                   **(state.args.apply_chat_template_kwargs or {}))
        return state.tokenizer.encode(text, add_special_tokens=False)
    return state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]


def _apply_output(sample: Sample, input_ids: list[int], output: dict[str, Any]) -> Sample:
    """Record one engine answer on the sample: tokens exactly as generated, log-probs, status.

    `input_ids` is what was sent: the prompt, or for a resumed partial sample the prompt plus
    the response so far, which the new tokens extend.
    """
    meta = output["meta_info"]
    new_ids = list(output["output_ids"])
    resumed = sample.response_length > 0
    sample.tokens = list(input_ids) + new_ids
    sample.response = (sample.response if resumed else "") + output["text"]
    sample.response_length = (sample.response_length if resumed else 0) + len(new_ids)
    sample.loss_mask = (list(sample.loss_mask or []) if resumed else []) + [1] * len(new_ids)
    logprobs = meta.get("output_token_logprobs")
    if logprobs is not None:
        old = list(sample.rollout_log_probs or []) if resumed else []
        sample.rollout_log_probs = old + [float(lp[0]) for lp in logprobs]
    if not resumed:
        sample.weight_versions = []
    if meta.get("weight_version") is not None:
        sample.weight_versions.append(str(meta["weight_version"]))
    finish = (meta.get("finish_reason") or {}).get("type")
    sample.status = {
        "length": Sample.Status.TRUNCATED,
        "abort": Sample.Status.ABORTED,
    }.get(finish, Sample.Status.COMPLETED)
    return sample


def is_finished(sample: Sample) -> bool:
    """Done generating: a sample taken back from the Data Buffer in this state is not generated again."""
    return sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.FAILED)


def _resume_point(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> tuple[list[int], dict]:
    """What to send for this sample: the prompt, or (a partial sample from the Data Buffer) the
    prompt plus its response so far, with `max_new_tokens` reduced by what it already has."""
    state = GenerateState(args)
    if sample.response_length == 0:
        return prompt_ids_of(state, sample), sampling_params
    params = dict(sampling_params)
    if params.get("max_new_tokens") is not None:  # None: up to the context length, nothing to reduce
        params["max_new_tokens"] = max(0, int(params["max_new_tokens"]) - sample.response_length)
    if args.mask_offpolicy_in_partial_rollout:
        # generated by older weights: do not train on those tokens
        sample.loss_mask = [0] * sample.response_length
    return list(sample.tokens), params


async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Default single-sample generate: one `/generate` call, token in, token out. A partial
    sample (ABORTED with a response, from the Data Buffer) continues where it stopped."""
    state = GenerateState(args)
    if state.aborted:  # the rollout is collecting its long tail: do not start new work
        sample.status = Sample.Status.ABORTED
        return sample
    input_ids, params = _resume_point(args, sample, sampling_params)
    if params.get("max_new_tokens") is not None and params["max_new_tokens"] <= 0:  # whole budget used before
        sample.status = Sample.Status.TRUNCATED
        return sample
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    output = await post(engine_url(args), payload, headers=session_headers(sample.session_id))
    return _apply_output(sample, input_ids, output)


async def _generate_group_batched(args: Namespace, group: list[Sample], sampling_params: dict[str, Any]) -> None:
    """The n samples of one prompt as one batch request: one HTTP round trip per group."""
    state = GenerateState(args)
    if state.aborted:
        for sample in group:
            sample.status = Sample.Status.ABORTED
        return
    prompt_ids = prompt_ids_of(state, group[0])
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
        sample.tokens, sample.response_length, sample.loss_mask = prompt_ids_of(state, sample), 0, []
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
    if args.group_rm:
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
    todo = [s for s in group if not is_finished(s)]  # a group from the Data Buffer may be partly done
    async with state.semaphore:
        if state.custom_generate is not None:
            results = await asyncio.gather(
                *(_custom_generate_one(args, s, copy.deepcopy(sampling_params), evaluation) for s in todo)
            )
            by_id = {id(s): res for s, res in zip(todo, results)}
            group[:] = [r for s in group for r in by_id.get(id(s), [s])]
        else:
            fresh = len(todo) == len(group) and all(s.response_length == 0 for s in group)
            try:
                if fresh:
                    await _generate_group_batched(args, group, sampling_params)
                else:
                    await asyncio.gather(*(generate(args, s, sampling_params) for s in todo))
            except Exception as e:  # one bad group must not kill the rollout; it is marked and counted
                logger.exception("generate failed for group %s", group[0].group_index)
                for s in todo:
                    _mark_failed(s, "generate", e)
                    _ensure_tokens(state, s)
    await _reward(args, group)
    return group


async def _dynamic_filter(args: Namespace, fn: Any, group: list[Sample]) -> tuple[bool, str | None]:
    """slime's dynamic-sampling contract: fn(args, samples) -> bool or DynamicFilterOutput(keep, reason)."""
    if fn is None:
        return True, None
    try:
        out = await _maybe_await(fn(args, group))
    except Exception as e:
        raise SlimeError(f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} raised "
                         f"{type(e).__name__}: {e}") from e
    if isinstance(out, DynamicFilterOutput):
        return bool(out.keep), out.reason
    return bool(out), None


async def abort_engines(args: Namespace) -> None:
    """Stop every engine's in-flight requests; they answer at once with their partial output
    (`finish_reason` abort). Requests not yet sent are stopped by `GenerateState.aborted`."""
    urls = args.rollout_engine_urls or [engine_url(args, "").rstrip("/")]
    results = await asyncio.gather(*(post(f"{u}/abort_request", {"abort_all": True}) for u in urls),
                                   return_exceptions=True)
    for url, result in zip(urls, results):
        if isinstance(result, BaseException):  # its requests then run to their end: slower, still correct
            logger.warning("could not abort the requests of %s: %s", url, result)


async def generate_rollout_async(args: Namespace, rollout_id: int, data_source: Any) -> RolloutFnTrainOutput:
    """Generate until `--rollout-batch-size` groups are kept.

    Groups come from the data source (its Data Buffer first) `--over-sampling-batch-size` at a
    time (default `--rollout-batch-size`); each finished group passes the
    `--dynamic-sampling-filter-path` filter or is dropped and replaced. Once enough are kept,
    the long tail still generating is aborted. With `--partial-rollout` those groups (and
    finished ones not needed) go back into the Data Buffer, partial responses and all, and the
    next rollout resumes them; without it they are discarded and counted.
    """
    state = GenerateState(args)
    filter_path = args.dynamic_sampling_filter_path
    fn = load_function(filter_path, arg_name="--dynamic-sampling-filter-path") if filter_path else None
    target = args.rollout_batch_size
    batch = args.over_sampling_batch_size or target
    budget = DYNAMIC_SAMPLING_BUDGET * max(target, batch)  # groups tried before the filter is called hopeless
    kept: list[list[Sample]] = []
    surplus: list[list[Sample]] = []  # finished and kept-worthy, but beyond the target
    drops: dict[str, int] = {}
    pending: set[asyncio.Task] = set()
    generated = resumed = 0
    state.aborted = False
    try:
        while len(kept) < target:
            if len(kept) + len(pending) < target:  # not enough in flight to reach the target: fetch more
                if generated >= budget:
                    raise SlimeError(
                        f"rollout {rollout_id}: --dynamic-sampling-filter-path {filter_path} kept {len(kept)} of "
                        f"{generated} groups, fewer than --rollout-batch-size {target} "
                        f"(drops: {drops or 'no reason given'})"
                    )
                groups = data_source.get_samples(batch)
                generated += len(groups)
                resumed += sum(any(smp.response_length > 0 or is_finished(smp) for smp in g) for g in groups)
                pending |= {asyncio.ensure_future(generate_and_rm_group(args, g, state.sampling_params))
                            for g in groups}
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = task.result()
                keep, reason = await _dynamic_filter(args, fn, group)
                if keep:
                    (kept if len(kept) < target else surplus).append(group)
                else:
                    drops[reason or "unspecified"] = drops.get(reason or "unspecified", 0) + 1
        tail: list[list[Sample]] = []
        if pending:
            state.aborted = True
            await abort_engines(args)
            tail = list(await asyncio.gather(*pending))
            pending = set()
    finally:
        state.aborted = False
        for task in pending:  # an error above: do not leave generation running
            task.cancel()

    metrics = {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
    metrics["rollout/dynamic_filter/generated_groups"] = float(generated)
    metrics["rollout/buffer/resumed_groups"] = float(resumed)
    kept.sort(key=lambda g: g[0].group_index if g and g[0].group_index is not None else -1)
    leftover = surplus + tail
    if args.partial_rollout and hasattr(data_source, "add_samples"):
        data_source.add_samples(leftover)
        metrics["rollout/buffer/returned_groups"] = float(len(leftover))
    else:
        metrics["rollout/partial/discarded_groups"] = float(len(leftover))
    if hasattr(data_source, "get_buffer_length"):
        metrics["rollout/buffer/size"] = float(data_source.get_buffer_length())
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


def _eval_datasets(args: Namespace) -> dict[str, list[Sample]]:
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
