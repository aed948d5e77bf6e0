"""The default rollout: prompts -> engine `/generate` over HTTP -> rewards.

Same names and contracts as slime's `slime.rollout.sglang_rollout`:
* `generate_rollout(args, rollout_id, data_source, evaluation=False)` is the
  `--rollout-function-path` default; it returns a list of groups (lists of `Sample`), or, with
  `evaluation=True`, `{name: {"rewards": [...], "samples": [...]}}` per eval data set.
* `generate(args, sample, sampling_params)` is the default per-sample generate function; a
  `--custom-generate-function-path` hook has the same signature.
* `generate_and_rm(args, sample, sampling_params, evaluation=False)` generates one sample (the
  sample's own `generate_function_path`, else `--custom-generate-function-path`, else
  `generate`) and scores it; `generate_and_rm_group` does a whole group.
* `GenerateState` is the per-process singleton hooks use for `.tokenizer`, `.processor`,
  `.semaphore` and `.sampling_params`; a custom rollout loop may submit groups with
  `state.submit_generate_tasks(groups)` (tasks in `state.pendings`) and stop the rest with
  `await abort(args, rollout_id)`, which hands back the partial groups under `--partial-rollout`.
* `eval_rollout(args, rollout_id)` -> `(RolloutFnEvalOutput, [])`; `get_model_url(args, name)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import logging
import random
import threading
import traceback
import weakref
from argparse import Namespace
from types import SimpleNamespace
from collections.abc import Callable, Iterator
from typing import Any

from transformers import AutoTokenizer

from slime.data.dataset import load_prompt_samples
from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import (
    DynamicFilterOutput,
    call_dynamic_filter,
    should_drop_dynamic_filter_output,
)
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.utils.async_utils import run
from slime.utils.http_utils import post, session_headers
from slime.utils.misc import load_function
from slime.utils.processing_utils import load_processor
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

DYNAMIC_SAMPLING_BUDGET = 10  # x the target: a dynamic-sampling filter that keeps less than 1 in 10 stops the run


class _ClassOrInstanceMethod:
    """One name, two meanings by how it is called: on the class (`GenerateState.reset()`, this
    project's tests and examples) and on the instance (`state.reset()`, slime's)."""

    def __init__(self, on_class: Callable[[type], Any], on_instance: Callable[[Any], Any]):
        self.on_class, self.on_instance = on_class, on_instance

    def __get__(self, obj: Any, owner: type) -> Callable[[], Any]:
        return functools.partial(self.on_class, owner) if obj is None else functools.partial(self.on_instance, obj)


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
        # slime's bookkeeping for a rollout loop that submits through this state
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.dp_counts = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """Bounds in-flight requests (`--sglang-server-concurrency` per engine). One per event loop:
        an asyncio semaphore belongs to one loop, and a hook may generate from its own thread's loop."""
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.concurrency)
        return sem

    @functools.cached_property
    def processor(self) -> Any:
        """The model's multimodal processor (None for a text-only model); loaded on first use."""
        return load_processor(self.args.hf_checkpoint)

    @contextlib.contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """Pick a least-loaded data-parallel rank for one request (slime's balancing)."""
        counts = self.dp_counts
        rank = random.choice([i for i, c in enumerate(counts) if c == min(counts)])
        counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            counts[rank] -= 1

    def submit_generate_tasks(self, samples: list[list[Sample]]) -> None:
        """Start generating each group as one task (into `pendings`); counts them as remaining."""
        for group in samples:
            self.pendings.add(asyncio.ensure_future(
                generate_and_rm_group(self.args, group, sampling_params=dict(self.sampling_params), evaluation=False)))
        self.remaining_batch_size += len(samples)

    def _reset_rollout(self) -> None:
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False

    # `GenerateState.reset()` forgets the singleton (the next call builds a fresh one);
    # `state.reset()` clears one rollout's bookkeeping, as slime's does.
    reset = _ClassOrInstanceMethod(lambda cls: setattr(cls, "_instance", None), _reset_rollout)


def get_model_url(args: Namespace, model_name: str, endpoint: str = "/generate") -> str:
    """The URL of `endpoint` on the router serving `model_name` (`args.sglang_model_routers`:
    name -> (ip, port)), or on the default router when that model has none of its own."""
    routers = getattr(args, "sglang_model_routers", None)
    if routers and model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


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
    sample.prefix_cache_info.add(meta)  # cached_tokens / prompt_tokens when the engine reports them
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


def _generate_function(args: Namespace, sample: Sample) -> tuple[Callable | None, str | None]:
    """The sample's own generate function (an eval data set's), else --custom-generate-function-path."""
    path = getattr(sample, "generate_function_path", None)
    if path:
        return load_function(path, arg_name="Sample.generate_function_path"), path
    path = args.custom_generate_function_path
    if not path:
        return None, None
    fn = getattr(GenerateState(args), "custom_generate", None)  # loaded once at start-up
    return fn or load_function(path, arg_name="--custom-generate-function-path"), path


async def _call_generate_hook(args: Namespace, sample: Sample, sampling_params: dict[str, Any],
                              evaluation: bool) -> Sample | list[Sample]:
    """One call of the sample's generate hook, its answer as it gave it (a Sample or a list of
    them); its exception fails only this sample (which is then the answer)."""
    state = GenerateState(args)
    fn, path = None, args.custom_generate_function_path
    try:
        fn, path = _generate_function(args, sample)
        if "evaluation" in inspect.signature(fn).parameters:
            result = await _maybe_await(fn(args, sample, sampling_params, evaluation=evaluation))
        else:
            result = await _maybe_await(fn(args, sample, sampling_params))
        results = result if isinstance(result, list) else [result]
        if not results or not all(isinstance(r, Sample) for r in results):
            raise TypeError(f"returned {type(result).__name__}, not a Sample or a list of Samples")
        return result
    except Exception as e:
        logger.exception("generate function %s failed for sample %s", path, sample.index)
        _mark_failed(sample, f"--custom-generate-function-path {path}", e)
        _ensure_tokens(state, sample)
        return sample


async def _custom_generate_one(args: Namespace, sample: Sample, sampling_params: dict[str, Any],
                               evaluation: bool) -> list[Sample]:
    result = await _call_generate_hook(args, sample, sampling_params, evaluation)
    return result if isinstance(result, list) else [result]


async def _default_generate_one(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """`generate` on one sample; an error fails only this sample."""
    try:
        return await generate(args, sample, sampling_params)
    except Exception as e:
        logger.exception("generate failed for sample %s", sample.index)
        _mark_failed(sample, "generate", e)
        _ensure_tokens(GenerateState(args), sample)
        return sample


async def generate_and_rm(args: Namespace, sample: Sample, sampling_params: dict[str, Any],
                          evaluation: bool = False) -> Sample | list[Sample]:
    """slime's per-sample step: generate one sample, then score it (unless `--group-rm`, where the
    group is scored whole by the caller). A generate function that returns several samples
    gets them scored in one `batched_async_rm` call, as slime does; a sample that already has a
    reward keeps it. A sample already COMPLETED or TRUNCATED (from the Data Buffer) is returned as it is."""
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length  # generated by older weights
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        return sample
    state = GenerateState(args)
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        if _generate_function(args, sample)[0] is not None:
            result = await _call_generate_hook(args, sample, copy.deepcopy(sampling_params), evaluation)
        else:
            result = await _default_generate_one(args, sample, dict(sampling_params))
    if args.group_rm:
        return result
    if isinstance(result, list):
        if any(s.status == Sample.Status.ABORTED for s in result):
            return result
        todo = [s for s in result if s.reward is None and s.status != Sample.Status.FAILED]
        if todo:
            try:
                rewards = list(await batched_async_rm(args, todo))
            except Exception as e:
                logger.exception("reward failed for the samples of %s", sample.index)
                for s in todo:
                    _mark_failed(s, "reward", e)
                return result
            for s, r in zip(todo, rewards):
                s.reward = r
        return result
    if result.status not in (Sample.Status.ABORTED, Sample.Status.FAILED) and result.reward is None:
        await _reward(args, [result])
    return result


async def _as_list(coro: Any) -> list[Sample]:
    return [await coro]


async def generate_and_rm_group(
    args: Namespace, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample]:
    """Generate every sample of a group, then score them. A failure marks samples FAILED."""
    state = GenerateState(args)
    todo = [s for s in group if not is_finished(s)]  # a group from the Data Buffer may be partly done
    async with state.semaphore:
        if state.custom_generate is not None or any(getattr(s, "generate_function_path", None) for s in todo):
            results = await asyncio.gather(*(
                _custom_generate_one(args, s, copy.deepcopy(sampling_params), evaluation)
                if _generate_function(args, s)[0] is not None
                else _as_list(_default_generate_one(args, s, dict(sampling_params)))
                for s in todo
            ))
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


async def _dynamic_filter(args: Namespace, fn: Any, group: list[Sample]) -> DynamicFilterOutput:
    """slime's dynamic-sampling contract: fn(args, samples) -> bool or DynamicFilterOutput (an
    async filter is awaited)."""
    try:
        out = call_dynamic_filter(fn, args, group)
        if inspect.isawaitable(out.keep):  # an async filter: call_dynamic_filter wrapped its coroutine
            out = await out.keep
            out = out if isinstance(out, DynamicFilterOutput) else DynamicFilterOutput(keep=out)
    except Exception as e:
        raise SlimeError(f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} raised "
                         f"{type(e).__name__}: {e}") from e
    out.keep = bool(out.keep)
    return out


async def abort_engines(args: Namespace) -> None:
    """Stop every engine's in-flight requests; they answer at once with their partial output
    (`finish_reason` abort). Requests not yet sent are stopped by `GenerateState.aborted`."""
    urls = args.rollout_engine_urls or [engine_url(args, "").rstrip("/")]
    results = await asyncio.gather(*(post(f"{u}/abort_request", {"abort_all": True}) for u in urls),
                                   return_exceptions=True)
    for url, result in zip(urls, results):
        if isinstance(result, BaseException):  # its requests then run to their end: slower, still correct
            logger.warning("could not abort the requests of %s: %s", url, result)


async def abort(args: Namespace, rollout_id: int) -> list[list[Sample]]:
    """slime's end of a rollout loop that submitted through `GenerateState`: stop what the
    engines are generating, wait for every task in `state.pendings`, and (with
    `--partial-rollout`) return those groups, partial responses and all, for the Data Buffer."""
    state = GenerateState(args)
    if state.aborted:
        raise SlimeError("abort(): this rollout is already aborting")
    state.aborted = True
    await abort_engines(args)
    collected: list[list[Sample]] = []
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not args.partial_rollout:
            continue
        for task in done:
            group = task.result()
            for smp in group:
                if smp.response and "start_rollout_id" not in smp.metadata:
                    smp.metadata["start_rollout_id"] = rollout_id
            collected.append(group)
    if args.partial_rollout:
        logger.info("collected %d partial samples for the data buffer", sum(len(g) for g in collected))
    return collected


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
            unexamined = len(done)
            for task in done:
                group = task.result()
                out = await _dynamic_filter(args, fn, group)
                # slime's remaining_batch_size: groups that may still fill the batch, this one included
                remaining = len(kept) + len(surplus) + len(pending) + unexamined
                unexamined -= 1
                if not should_drop_dynamic_filter_output(out, remaining_batch_size=remaining, target_data_size=target):
                    (kept if len(kept) < target else surplus).append(group)
                else:
                    reason = out.reason or "unspecified"
                    drops[reason] = drops.get(reason, 0) + 1
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
    for g in tail:  # where a partial response began (slime's metadata)
        for smp in g:
            if smp.response and "start_rollout_id" not in smp.metadata:
                smp.metadata["start_rollout_id"] = rollout_id
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
        key_args = SimpleNamespace(reward_key=args.eval_reward_key or args.reward_key)
        results[name] = {"rewards": [s.get_reward_value(key_args) for s in samples],
                         "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
                         "samples": samples}
    return results


async def eval_rollout(args: Namespace, rollout_id: int) -> tuple[RolloutFnEvalOutput, list[list[Sample]]]:
    """slime's async eval entry: every eval data set's results, and no partial samples."""
    return RolloutFnEvalOutput(data=await eval_rollout_async(args, rollout_id)), []


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract (sync; runs on the process's background event loop)."""
    if evaluation:
        return run(eval_rollout_async(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))


__all__ = ["GenerateState", "abort", "eval_rollout", "generate", "generate_and_rm", "generate_and_rm_group",
           "generate_rollout", "get_model_url", "async_rm"]
