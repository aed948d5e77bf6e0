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

The rollout loop (dynamic filtering, over-sampling, partial rollouts, abort) is here; one
sample's generation and reward is `slime.rollout.generation`, evaluation `slime.rollout.eval_rollout`;
this module re-exports their names, so slime's imports work.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from argparse import Namespace
from typing import Any

from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.eval_rollout import (
    eval_rollout,
    eval_rollout_async,
    eval_rollout_single_dataset,
    eval_sampling_params,
    load_eval_prompts,
)
from slime.rollout.filter_hub.base_types import (
    DynamicFilterOutput,
    call_dynamic_filter,
    should_drop_dynamic_filter_output,
)
from slime.rollout.generation import (
    GenerateState,
    _maybe_await,
    context_limit,
    engine_url,
    engine_urls,
    fit_context,
    generate,
    generate_and_rm,
    generate_and_rm_group,
    get_model_url,
    is_finished,
    prompt_ids_of,
    sampling_params_from_args,
)
from slime.rollout.rm_hub import async_rm
from slime.rollout.sample_hooks import set_current_rollout_id
from slime.utils.async_utils import run
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

# slime's import path for the rollout's names (the code lives in generation.py and eval_rollout.py)
__all__ = [
    "GenerateState",
    "abort",
    "abort_engines",
    "context_limit",
    "engine_url",
    "eval_rollout",
    "eval_rollout_async",
    "eval_rollout_single_dataset",
    "eval_sampling_params",
    "fit_context",
    "generate",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_rollout",
    "generate_rollout_async",
    "get_model_url",
    "is_finished",
    "load_eval_prompts",
    "prompt_ids_of",
    "sampling_params_from_args",
    "set_current_rollout_id",
]

logger = logging.getLogger(__name__)

DYNAMIC_SAMPLING_BUDGET = 10  # x the target: a dynamic-sampling filter that keeps less than 1 in 10 stops the run


async def _dynamic_filter(args: Namespace, fn: Any, group: list[Sample]) -> DynamicFilterOutput:
    """slime's dynamic-sampling contract: fn(args, samples) -> bool or DynamicFilterOutput (an
    async filter is awaited)."""
    try:
        out = call_dynamic_filter(fn, args, group)
        if inspect.isawaitable(out.keep):  # an async filter: call_dynamic_filter wrapped its coroutine
            out = await out.keep
            out = out if isinstance(out, DynamicFilterOutput) else DynamicFilterOutput(keep=out)
    except Exception as e:
        raise SlimeError(
            f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} raised {type(e).__name__}: {e}"
        ) from e
    out.keep = bool(out.keep)
    return out


async def abort_engines(args: Namespace) -> None:
    """Stop every engine's in-flight requests; they answer at once with their partial output
    (`finish_reason` abort). Requests not yet sent are stopped by `GenerateState.aborted`."""
    urls = engine_urls(args)
    results = await asyncio.gather(
        *(post(f"{u}/abort_request", {"abort_all": True}) for u in urls), return_exceptions=True
    )
    for url, result in zip(urls, results, strict=True):
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
            _mark_partial_start([group], rollout_id)
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
    next rollout resumes them; without it they are discarded and counted. A
    `--rollout-all-samples-process-path` hook then sees every finished group, dropped ones included.
    """
    state = GenerateState(args)
    set_current_rollout_id(rollout_id)  # what --rollout-sample-hook-path hooks are told
    filter_path = args.dynamic_sampling_filter_path
    fn = load_function(filter_path, arg_name="--dynamic-sampling-filter-path") if filter_path else None
    target = args.rollout_batch_size
    batch = args.over_sampling_batch_size or target
    budget = DYNAMIC_SAMPLING_BUDGET * max(target, batch)  # groups tried before the filter is called hopeless
    kept: list[list[Sample]] = []
    surplus: list[list[Sample]] = []  # finished and kept-worthy, but beyond the target
    dropped: list[list[Sample]] = []  # finished, dropped by the dynamic-sampling filter
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
                pending |= {
                    asyncio.ensure_future(generate_and_rm_group(args, g, state.sampling_params)) for g in groups
                }
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
                    dropped.append(group)
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
    _mark_partial_start(tail, rollout_id)
    metrics.update(_return_leftover(args, data_source, surplus + tail))
    await _process_all_samples(args, rollout_id, kept + surplus + dropped, data_source)
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


def _mark_partial_start(groups: list[list[Sample]], rollout_id: int) -> None:
    """Where a partial response began (slime's metadata): the rollout that started it."""
    for g in groups:
        for smp in g:
            if smp.response and "start_rollout_id" not in smp.metadata:
                smp.metadata["start_rollout_id"] = rollout_id


def _return_leftover(args: Namespace, data_source: Any, leftover: list[list[Sample]]) -> dict[str, float]:
    """Groups generated but not needed (the surplus and the aborted tail): back into the Data
    Buffer with `--partial-rollout`, else discarded; returns the metrics that count them."""
    metrics: dict[str, float] = {}
    if args.partial_rollout and hasattr(data_source, "add_samples"):
        data_source.add_samples(leftover)
        metrics["rollout/buffer/returned_groups"] = float(len(leftover))
    else:
        metrics["rollout/partial/discarded_groups"] = float(len(leftover))
    if hasattr(data_source, "get_buffer_length"):
        metrics["rollout/buffer/size"] = float(data_source.get_buffer_length())
    return metrics


async def _process_all_samples(args: Namespace, rollout_id: int, groups: list[list[Sample]], data_source: Any) -> None:
    """slime's `--rollout-all-samples-process-path`: fn(args, all_samples, data_source) on every group
    that finished this rollout (ordered by its first sample's index), the filter's drops included;
    not the long tail that was aborted. It sees the whole rollout, so an error in it stops the run."""
    path = args.rollout_all_samples_process_path
    if not path:
        return
    fn = load_function(path, arg_name="--rollout-all-samples-process-path")
    groups = sorted(groups, key=lambda g: g[0].index if g and g[0].index is not None else -1)
    try:
        await _maybe_await(fn(args, groups, data_source))
    except Exception as e:
        raise SlimeError(
            f"rollout {rollout_id}: --rollout-all-samples-process-path {path} raised {type(e).__name__}: {e}"
        ) from e


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract (sync; runs on the process's background event loop)."""
    if evaluation:
        return run(eval_rollout_async(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))


__all__ = [
    "GenerateState",
    "abort",
    "eval_rollout",
    "eval_rollout_single_dataset",
    "generate",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_rollout",
    "get_model_url",
    "async_rm",
]
