"""One sample (or group) from prompt to scored response, slime's way: `GenerateState` (the
per-process singleton hooks use), the sampling parameters from the arguments, the default
`generate` (token ids in and out of an engine's `/generate`, partial samples resumed, the
context length respected), `--rollout-sample-hook-path` hooks, rewards, and
`generate_and_rm` / `generate_and_rm_group`. slime's import path for all of it is
`slime.rollout.sglang_rollout`, which re-exports these names.
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
from collections.abc import Callable, Iterator
from typing import Any

from transformers import AutoTokenizer

from slime.errors import SlimeError
from slime.observability.trace_utils import trace_span
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.rollout.sample_hooks import (
    apply_hook,
    current_rollout_id,
)
from slime.utils.http_utils import post, server_lost, session_headers
from slime.utils.misc import load_function
from slime.utils.processing_utils import load_processor
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


class _ClassOrInstanceMethod:
    """One name, two meanings by how it is called: on the class (`GenerateState.reset()`, this
    project's tests and examples) and on the instance (`state.reset()`, slime's)."""

    def __init__(self, on_class: Callable[[type], Any], on_instance: Callable[[Any], Any]):
        self.on_class, self.on_instance = on_class, on_instance

    def __get__(self, obj: Any, owner: type) -> Callable[[], Any]:
        return functools.partial(self.on_class, owner) if obj is None else functools.partial(self.on_instance, obj)


class GenerateState:
    """Per-process state shared by every generate call (slime's singleton)."""

    _instance: GenerateState | None = None
    _lock = threading.Lock()

    def __new__(cls, args: Namespace) -> GenerateState:
        with cls._lock:  # a hook's background thread and the rollout may both ask first
            if cls._instance is None:
                cls._instance = cls.build(args, AutoTokenizer.from_pretrained(args.hf_checkpoint))
        return cls._instance

    @classmethod
    def build(cls, args: Namespace, tokenizer: Any) -> GenerateState:
        """A state for `args` around `tokenizer` (None where nothing is tokenized: hooks that stand
        in for the engine), not installed as the process's instance."""
        inst = super().__new__(cls)
        inst._setup(args, tokenizer)
        return inst

    def _setup(self, args: Namespace, tokenizer: Any) -> None:
        self.args = args
        self.tokenizer = tokenizer
        # --deterministic-mode: one group at a time, in the order they were submitted (asyncio's
        # semaphore wakes waiters first come, first served), so every run batches the same way
        self.concurrency = 1 if args.deterministic_mode else args.sglang_server_concurrency * args.num_engines
        self._semaphores: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()
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
            self.pendings.add(
                asyncio.ensure_future(
                    generate_and_rm_group(
                        self.args, group, sampling_params=dict(self.sampling_params), evaluation=False
                    )
                )
            )
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
    name -> (ip, port), filled by the rollout manager once every model is up), or on the default
    router when the run has no --sglang-config. A name --sglang-config does not define is an error
    there: falling back to the policy would let it answer in a judge's or teacher's place."""
    routers = getattr(args, "sglang_model_routers", None)
    if routers and model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    if routers and args.sglang_config is not None:
        raise SlimeError(
            f"get_model_url: --sglang-config {args.sglang_config} defines no model {model_name!r} "
            f"(its models: {', '.join(routers)})"
        )
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


def sampling_params_from_args(args: Namespace, *, evaluation: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": args.eval_temperature if evaluation else args.rollout_temperature,
        "top_p": args.eval_top_p if evaluation else args.rollout_top_p,
        "top_k": args.eval_top_k if evaluation else args.rollout_top_k,
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


# Every engine this process's rollouts talk to, kept up to date by the rollout manager (an engine
# the router dropped is gone from it): a rollout function's signature (slime's) has no place for it.
_engine_urls: list[str] = []


def set_engine_urls(urls: list[str]) -> None:
    """Set by the rollout manager once its engines run, and whenever one is removed."""
    global _engine_urls
    _engine_urls = list(urls)


def engine_urls(args: Namespace) -> list[str]:
    """Where an abort goes: each engine the rollout manager set, else the --sglang-router-ip address."""
    return list(_engine_urls) or [engine_url(args, "").rstrip("/")]


def prompt_ids_of(state: GenerateState, sample: Sample) -> list[int]:
    if sample.tokens:
        return list(sample.tokens[: len(sample.tokens) - sample.response_length])
    if isinstance(sample.prompt, list):  # chat messages not yet templated
        # rendered, then encoded: with tokenize=True transformers 5 returns a BatchEncoding, not ids
        text = state.tokenizer.apply_chat_template(
            sample.prompt, add_generation_prompt=True, tokenize=False, **(state.args.apply_chat_template_kwargs or {})
        )
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


def context_limit(args: Namespace, evaluation: bool = False) -> int | None:
    """The engine context a generate call must fit: --rollout-max-context-len (evaluation: slime's
    eval_max_context_len, which defaults to the rollout's)."""
    if evaluation and args.eval_max_context_len:
        return args.eval_max_context_len
    return args.rollout_max_context_len


def fit_context(sampling_params: dict[str, Any], num_sent: int, context: int | None) -> dict[str, Any]:
    """`max_new_tokens` cut so that the `num_sent` tokens sent plus the answer fit `context`
    (None: no limit of its own, so the room left is the limit)."""
    if context is None:
        return sampling_params
    room = context - num_sent
    wanted = sampling_params.get("max_new_tokens")
    new = room if wanted is None else min(int(wanted), room)
    fitted = {**sampling_params, "max_new_tokens": new}
    if sampling_params.get("min_new_tokens") is not None:  # never more than the room left
        fitted["min_new_tokens"] = max(0, min(int(sampling_params["min_new_tokens"]), new))
    return fitted


def _truncated_before_start(sample: Sample, input_ids: list[int]) -> Sample:
    """No room left to generate: TRUNCATED as it is (a fresh sample gets its prompt tokens, an
    empty response)."""
    if sample.response_length == 0:
        sample.tokens, sample.response, sample.loss_mask, sample.rollout_log_probs = list(input_ids), "", [], []
    sample.status = Sample.Status.TRUNCATED
    return sample


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


async def generate(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], *, evaluation: bool = False
) -> Sample:
    """Default single-sample generate: one `/generate` call, token in, token out. A partial
    sample (ABORTED with a response, from the Data Buffer) continues where it stopped. With
    --rollout-max-context-len, `max_new_tokens` is cut so that what is sent plus the answer fits."""
    state = GenerateState(args)
    if state.aborted:  # the rollout is collecting its long tail: do not start new work
        sample.status = Sample.Status.ABORTED
        return sample
    input_ids, params = _resume_point(args, sample, sampling_params)
    params = fit_context(params, len(input_ids), context_limit(args, evaluation))
    if params.get("max_new_tokens") is not None and params["max_new_tokens"] <= 0:  # no budget or room left
        return _truncated_before_start(sample, input_ids)
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    with trace_span(sample, "sglang_generate", attrs={"max_new_tokens": params.get("max_new_tokens")}):
        output = await post(engine_url(args), payload, headers=session_headers(sample.session_id))
    return _apply_output(sample, input_ids, output)


async def _generate_group_batched(
    args: Namespace, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> None:
    """The n samples of one prompt as one batch request: one HTTP round trip per group."""
    state = GenerateState(args)
    if state.aborted:
        for sample in group:
            sample.status = Sample.Status.ABORTED
        return
    prompt_ids = prompt_ids_of(state, group[0])
    params = fit_context(dict(sampling_params), len(prompt_ids), context_limit(args, evaluation))
    if params.get("max_new_tokens") is not None and params["max_new_tokens"] <= 0:
        for sample in group:
            _truncated_before_start(sample, prompt_ids)
        return
    payload = {
        "input_ids": [prompt_ids] * len(group),
        "sampling_params": params,  # one dict for the batch: what sglang-router accepts too
        "return_logprob": True,
    }
    with trace_span(group, "sglang_generate", attrs={"max_new_tokens": params.get("max_new_tokens")}):
        outputs = await post(engine_url(args), payload, headers=session_headers(group[0].session_id))
    for sample, output in zip(group, outputs, strict=True):
        _apply_output(sample, prompt_ids, output)


def _mark_failed(sample: Sample, where: str, error: BaseException, *, generating: bool = False) -> None:
    """A hook or reward that raised: the sample is FAILED (kept, never trained on), with the reason.
    A generate call (`generating`) that failed because its engine or router is gone or broken also
    sets `metadata["server_lost"]`, so the rollout manager can say that a restart would have helped."""
    sample.status = Sample.Status.FAILED
    sample.metadata["error"] = f"{where}: {type(error).__name__}: {error}"
    sample.metadata["traceback"] = traceback.format_exc()
    if generating and server_lost(error):
        sample.metadata["server_lost"] = True


def _ensure_tokens(state: GenerateState, sample: Sample) -> None:
    """Keep a failed sample well-formed (it is never trained on): prompt tokens, a matching mask."""
    if not sample.tokens:
        sample.tokens, sample.response_length, sample.loss_mask = prompt_ids_of(state, sample), 0, []
    if sample.loss_mask is None or len(sample.loss_mask) != sample.response_length:
        sample.loss_mask = [0] * sample.response_length


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _sample_hooks(args: Namespace, sample: Sample, evaluation: bool) -> Sample:
    """Every --rollout-sample-hook-path hook, in order, on one generated sample (before its reward):
    None keeps the sample (changed in place or not), a Sample replaces it. A hook that raises or
    returns something else fails that sample (the later hooks skip it). FAILED samples are not
    hooked, nor ABORTED ones: unfinished, they are hooked once a later rollout finishes them."""
    for path in args.rollout_sample_hook_path or ():
        if sample.status in (Sample.Status.FAILED, Sample.Status.ABORTED):
            break
        try:
            sample = await apply_hook(args, sample, path, rollout_id=current_rollout_id(), evaluation=evaluation)
        except Exception as e:
            logger.debug("--rollout-sample-hook-path %s failed for sample %s", path, sample.index, exc_info=True)
            _mark_failed(sample, f"--rollout-sample-hook-path {path}", e)
            _ensure_tokens(GenerateState(args), sample)
            break
    return sample


async def _hook_samples(args: Namespace, samples: list[Sample], evaluation: bool) -> list[Sample]:
    if not args.rollout_sample_hook_path:
        return samples
    return list(await asyncio.gather(*(_sample_hooks(args, s, evaluation) for s in samples)))


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
            with trace_span(todo, "group_reward_model"):
                rewards = list(await batched_async_rm(args, todo))
            if len(rewards) != len(todo):
                raise ValueError(f"returned {len(rewards)} rewards for a group of {len(todo)} samples")
        except Exception as e:
            logger.debug("group reward failed for group %s", todo[0].group_index, exc_info=True)
            for s in todo:
                _mark_failed(s, "reward (--group-rm)", e)
            return
        for s, r in zip(todo, rewards, strict=True):
            s.reward = r
        return

    async def one(s: Sample) -> None:
        try:
            with trace_span(s, "reward_model"):
                s.reward = await async_rm(args, s)
        except Exception as e:
            logger.debug("reward failed for sample %s", s.index, exc_info=True)
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


async def _call_generate_hook(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool
) -> Sample | list[Sample]:
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
        logger.debug("generate function %s failed for sample %s", path, sample.index, exc_info=True)
        _mark_failed(sample, f"--custom-generate-function-path {path}", e, generating=True)
        _ensure_tokens(state, sample)
        return sample


async def _custom_generate_one(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool
) -> list[Sample]:
    result = await _call_generate_hook(args, sample, sampling_params, evaluation)
    return result if isinstance(result, list) else [result]


async def _default_generate_one(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample:
    """`generate` on one sample; an error fails only this sample."""
    try:
        return await generate(args, sample, sampling_params, evaluation=evaluation)
    except Exception as e:
        logger.debug("generate failed for sample %s", sample.index, exc_info=True)
        _mark_failed(sample, "generate", e, generating=True)
        _ensure_tokens(GenerateState(args), sample)
        return sample


async def generate_and_rm(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
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
            result = await _default_generate_one(args, sample, dict(sampling_params), evaluation)
    hooked = await _hook_samples(args, result if isinstance(result, list) else [result], evaluation)
    result = hooked if isinstance(result, list) else hooked[0]
    if args.group_rm:
        return result
    if isinstance(result, list):
        if any(s.status == Sample.Status.ABORTED for s in result):
            return result
        todo = [s for s in result if s.reward is None and s.status != Sample.Status.FAILED]
        if todo:
            try:
                rewards = list(await batched_async_rm(args, todo))
                if len(rewards) != len(todo):
                    raise ValueError(f"returned {len(rewards)} rewards for {len(todo)} samples")
            except Exception as e:
                logger.debug("reward failed for the samples of %s", sample.index, exc_info=True)
                for s in todo:
                    _mark_failed(s, "reward", e)
                return result
            for s, r in zip(todo, rewards, strict=True):
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
    """Generate every sample of a group, then score them. A failure marks samples FAILED.

    With `args.sglang_enable_deterministic_inference` (--deterministic-mode or
    --sglang-enable-deterministic-inference) sample i of the group gets `sampling_seed`
    --rollout-seed + i, as slime's; with --deterministic-mode its samples go one request at a time."""
    state = GenerateState(args)
    todo = [s for s in group if not is_finished(s)]  # a group from the Data Buffer may be partly done
    seeded = args.sglang_enable_deterministic_inference
    seeds = {id(s): args.rollout_seed + i for i, s in enumerate(group)}

    def params_of(s: Sample) -> dict[str, Any]:
        return {**sampling_params, "sampling_seed": seeds[id(s)]} if seeded else dict(sampling_params)

    async def each(make: Callable[[Sample], Any]) -> list[Any]:
        if args.deterministic_mode:  # in order, one request at a time
            return [await make(s) for s in todo]
        return list(await asyncio.gather(*(make(s) for s in todo)))

    async with state.semaphore:
        if state.custom_generate is not None or any(getattr(s, "generate_function_path", None) for s in todo):
            results = await each(
                lambda s: (
                    _custom_generate_one(args, s, copy.deepcopy(params_of(s)), evaluation)
                    if _generate_function(args, s)[0] is not None
                    else _as_list(_default_generate_one(args, s, params_of(s), evaluation))
                )
            )
            generated = [r for res in results for r in res]
            by_id = {id(s): res for s, res in zip(todo, results, strict=True)}
            group[:] = [r for s in group for r in by_id.get(id(s), [s])]
        else:
            generated = list(todo)
            # one batch request carries one sampling_params dict: per-sample seeds go one request each
            fresh = not seeded and len(todo) == len(group) and all(s.response_length == 0 for s in group)
            try:
                if fresh:
                    await _generate_group_batched(args, group, sampling_params, evaluation)
                else:
                    await each(lambda s: generate(args, s, params_of(s), evaluation=evaluation))
            except Exception as e:  # one bad group must not kill the rollout; it is marked and counted
                logger.debug("generate failed for group %s", group[0].group_index, exc_info=True)
                for s in todo:
                    _mark_failed(s, "generate", e, generating=True)
                    _ensure_tokens(state, s)
    # --rollout-sample-hook-path on what was generated now (not on samples finished before), before rewards
    hooked = dict(zip(map(id, generated), await _hook_samples(args, generated, evaluation), strict=True))
    group[:] = [hooked.get(id(s), s) for s in group]
    await _reward(args, group)
    return group
