"""Evaluation rollouts, slime's way: each eval data set (`--eval-prompt-data` or `--eval-config`)
loaded with its own keys and template, generated and scored with its own sampling settings and
hooks, and reported under its name. Re-exported by `slime.rollout.sglang_rollout` (slime's path).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from argparse import Namespace
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from slime.data.dataset import PromptSamples, load_prompt_samples
from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnEvalOutput
from slime.rollout.generation import GenerateState, generate_and_rm_group
from slime.utils.eval_config import (
    EvalDatasetConfig,
    eval_dataset_configs,
    resolve_eval_dataset,
)
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def eval_sampling_params(args: Namespace, cfg: EvalDatasetConfig) -> dict[str, Any]:
    """One eval data set's sampling parameters, as slime's eval sends them (its own settings over
    the eval options over the rollout's, resolved in `cfg`)."""
    params: dict[str, Any] = {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "max_new_tokens": cfg.max_response_len,
        "skip_special_tokens": args.rollout_skip_special_tokens
        if cfg.skip_special_tokens is None
        else cfg.skip_special_tokens,
        "no_stop_trim": True if cfg.no_stop_trim is None else cfg.no_stop_trim,
        "spaces_between_special_tokens": False,
    }
    for key in ("stop", "stop_token_ids"):
        value = getattr(cfg, key)
        if value:
            params[key] = list(value) if isinstance(value, list) else [value]
    if cfg.repetition_penalty is not None:
        params["repetition_penalty"] = cfg.repetition_penalty
    if cfg.min_new_tokens is not None:
        params["min_new_tokens"] = cfg.min_new_tokens
    return params


def load_eval_prompts(
    args: Namespace, cfg: EvalDatasetConfig, tokenizer: Any, check: Callable[[Sample], None] | None = None
) -> PromptSamples:
    """One eval data set's prompts, read with its own keys and chat template. Prompts longer than
    --eval-max-prompt-len (needs `tokenizer`) are dropped and counted in `num_dropped`; a set left
    empty is an error. `slime/preflight.py` calls this too, so start-up reads what eval will."""
    max_len = args.eval_max_prompt_len
    try:
        prompts = load_prompt_samples(
            cfg.path,
            input_key=cfg.input_key,
            label_key=cfg.label_key,
            metadata_key=cfg.metadata_key,
            tool_key=cfg.tool_key,
            tokenizer=tokenizer,
            apply_chat_template=bool(cfg.apply_chat_template),
            apply_chat_template_kwargs=cfg.apply_chat_template_kwargs,
            max_prompt_len=max_len,
            check=check,
        )
    except SlimeError as e:
        raise SlimeError(f"eval data set {cfg.name!r}: {e}") from None
    if not prompts:
        raise SlimeError(
            f"eval data set {cfg.name!r} ({cfg.path}) holds no prompts"
            + (f" ({prompts.num_dropped} longer than --eval-max-prompt-len {max_len})" if prompts.num_dropped else "")
        )
    if prompts.num_dropped:
        logger.warning(
            "eval data set %r: %d prompts longer than --eval-max-prompt-len %d dropped",
            cfg.name,
            prompts.num_dropped,
            max_len,
        )
    return prompts


def _eval_datasets(args: Namespace) -> list[tuple[EvalDatasetConfig, list[Sample]]]:
    """Each eval data set with its prompts, read once per process (cached by name in
    `state.eval_datasets`; one a caller put there without a config takes the args' settings)."""
    state = GenerateState(args)
    configs = {cfg.name: cfg for cfg in eval_dataset_configs(args)}
    for name in state.eval_datasets:
        configs.setdefault(name, resolve_eval_dataset(args, name, None))
    for name, cfg in configs.items():
        if name not in state.eval_datasets:
            state.eval_datasets[name] = load_eval_prompts(args, cfg, state.tokenizer)
    return [(cfg, state.eval_datasets[name]) for name, cfg in configs.items()]


async def eval_rollout_single_dataset(
    args: Namespace, rollout_id: int, dataset_cfg: EvalDatasetConfig, prompts: list[Sample] | None = None
) -> dict[str, dict[str, Any]]:
    """slime's per-data-set eval: `n_samples_per_eval_prompt` samples of every prompt, generated
    with the data set's sampling parameters (its generate hook and reward, if it names them) and
    scored. Returns {name: {"rewards", "truncated", "samples", "dropped_long_prompts"}}."""
    if prompts is None:  # read once per process, as `_eval_datasets` does
        state = GenerateState(args)
        if dataset_cfg.name not in state.eval_datasets:
            state.eval_datasets[dataset_cfg.name] = load_eval_prompts(args, dataset_cfg, state.tokenizer)
        prompts = state.eval_datasets[dataset_cfg.name]
    params = eval_sampling_params(args, dataset_cfg)
    n = dataset_cfg.n_samples_per_eval_prompt
    groups = []
    for i, prompt in enumerate(prompts):
        group = [copy.deepcopy(prompt) for _ in range(n)]
        for j, s in enumerate(group):
            s.group_index, s.index = i, i * n + j
            s.metadata = dataset_cfg.inject_metadata(s.metadata)
            if dataset_cfg.custom_rm_path:
                s.custom_rm_path = dataset_cfg.custom_rm_path
            if dataset_cfg.custom_generate_function_path:
                s.generate_function_path = dataset_cfg.custom_generate_function_path
        groups.append(group)
    done = await asyncio.gather(*(generate_and_rm_group(args, g, params, evaluation=True) for g in groups))
    samples = [s for g in done for s in g]
    key_args = SimpleNamespace(reward_key=args.eval_reward_key or args.reward_key)
    return {
        dataset_cfg.name: {
            "rewards": [s.get_reward_value(key_args) for s in samples],
            "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
            "samples": samples,
            "dropped_long_prompts": getattr(prompts, "num_dropped", 0),
        }
    }


async def eval_rollout_async(args: Namespace, rollout_id: int) -> dict[str, dict[str, Any]]:
    """Every eval data set (`--eval-prompt-data` or `--eval-config`), each with its own settings."""
    results: dict[str, dict[str, Any]] = {}
    for part in await asyncio.gather(
        *(eval_rollout_single_dataset(args, rollout_id, cfg, prompts) for cfg, prompts in _eval_datasets(args))
    ):
        results.update(part)
    return results


async def eval_rollout(args: Namespace, rollout_id: int) -> tuple[RolloutFnEvalOutput, list[list[Sample]]]:
    """slime's async eval entry: every eval data set's results, and no partial samples."""
    return RolloutFnEvalOutput(data=await eval_rollout_async(args, rollout_id)), []
