"""slime's `slime.observability.rollout_metrics`: a rollout's metrics computed from its samples
(`rollout/*`, `perf/*`, `eval/*`), and slime's `log_rollout_data` / `log_eval_rollout_data`,
which honour `--custom-rollout-log-function-path` / `--custom-eval-rollout-log-function-path` and
report through `logging_utils.log`.

Speculative-decoding metrics are reported when the samples carry the engine's speculative counts
(slime keys them on `--sglang-speculative-algorithm`, an engine pass-through option here).
Engine request timings are read from the samples' `sglang_generate` trace spans, as slime's.
"""

from __future__ import annotations

import logging
import math
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from slime.observability import logging_utils
from slime.observability.metric_utils import (
    compute_pass_rate,
    compute_rollout_step,
    compute_statistics,
    dict_add_prefix,
    has_repetition,
)
from slime.utils.misc import group_by, load_function
from slime.utils.types import Sample

__all__ = [
    "compute_metrics_from_samples",
    "compute_perf_metrics_from_samples",
    "log_eval_rollout_data",
    "log_rollout_data",
]

logger = logging.getLogger(__name__)

# (metric key, attribute of the sglang_generate span)
_REQUEST_PERF_FIELDS = (
    ("request/e2e_latency", "e2e_latency"),
    ("request/queue_time", "queue_time"),
    ("decode/throughput", "decode_throughput"),
    *(
        (f"prefill/{k}_duration", f"pd_prefill_{k}_duration")
        for k in ("bootstrap_queue", "bootstrap", "alloc_wait", "forward", "transfer_queue")
    ),
    ("prefill/transfer_speed_gb_s", "pd_transfer_speed_gb_s"),
    ("prefill/transfer_total_mb", "pd_transfer_total_mb"),
    ("prefill/retry_count", "pd_prefill_retry_count"),
    *(
        (f"decode/{k}_duration", f"pd_decode_{k}_duration")
        for k in ("prealloc", "bootstrap", "alloc_wait", "transfer", "forward")
    ),
)


def compute_metrics_from_samples(args: Namespace, samples: list[Sample]) -> dict[str, float]:
    """Response length statistics, zero-std groups, speculative and prefix-cache rates, reward
    categories, the top-p vocabulary kept, the repetition and truncation fractions."""
    out: dict[str, float] = {}
    out |= dict_add_prefix(compute_statistics([s.effective_response_length for s in samples]), "response_len/")
    out |= _zero_std_metrics(args, samples)
    out |= _spec_metrics(samples)
    out |= _prefix_cache_metrics(samples)
    out |= _reward_cat_metrics(args, samples)
    out |= _top_p_kept_vocab_metrics(samples)
    out["repetition_frac"] = float(np.mean([int(has_repetition(s.response)) for s in samples]))
    out["truncated_ratio"] = float(np.mean([int(s.status == Sample.Status.TRUNCATED) for s in samples]))
    return out


def _token_perf(
    out: dict[str, float], args: Namespace, lengths: list[int], wait: list[float], rollout_time: float, key: str
) -> None:
    longest = max(lengths)
    if args.rollout_num_gpus:
        out[f"{key}tokens_per_gpu_per_sec"] = sum(lengths) / rollout_time / args.rollout_num_gpus
    out[f"longest_{key}sample_tokens_per_sec"] = longest / rollout_time
    if max(wait) == 0:
        return
    waits = [t for t, n in zip(wait, lengths, strict=True) if n == longest]
    mean_wait = sum(waits) / len(waits)
    out[f"longest_{key}sample_non_generation_time"] = mean_wait
    out[f"longest_{key}sample_tokens_per_sec_without_non_generation"] = longest / (rollout_time - mean_wait)


def compute_perf_metrics_from_samples(args: Namespace, samples: list[Sample], rollout_time: float) -> dict[str, float]:
    """Rollout time, token throughput (all and longest sample, with and without the time spent
    outside generation) and the engine's per-request timings."""
    wait = [s.non_generation_time for s in samples]
    out: dict[str, float] = {"rollout_time": rollout_time}
    if max(wait) > 0:
        out |= dict_add_prefix(compute_statistics(wait), "non_generation_time/")
    _token_perf(out, args, [s.response_length for s in samples], wait, rollout_time, "")
    _token_perf(out, args, [s.effective_response_length for s in samples], wait, rollout_time, "effective_")
    out |= _request_perf_metrics(samples)
    return out


def _generate_span_attrs(samples: list[Sample]) -> Iterator[dict[str, Any]]:
    for s in samples:
        trace = getattr(s, "trace", None)
        if not isinstance(trace, dict):
            continue
        for event in trace.get("events") or []:
            if event.get("type") == "span_end" and event.get("name") == "sglang_generate":
                if isinstance(event.get("attrs"), dict):
                    yield event["attrs"]


def _request_perf_metrics(samples: list[Sample]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for attrs in _generate_span_attrs(samples):
        for key, source in _REQUEST_PERF_FIELDS:
            v = attrs.get(source)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                values.setdefault(key, []).append(float(v))
    out: dict[str, float] = {}
    for key, vs in values.items():
        out |= dict_add_prefix(compute_statistics(vs), f"{key}/")
    return out


def _zero_std_metrics(args: Namespace, samples: list[Sample]) -> dict[str, int]:
    """`zero_std/count_<reward>`: groups whose rewards are all equal, by that reward (GRPO-like
    estimators only: one prompt, several responses)."""
    if args.advantage_estimator == "ppo":
        return {}
    flat = [
        g
        for g in group_by(samples, lambda s: s.group_index).values()
        if len({s.get_reward_value(args) for s in g}) <= 1
    ]
    by_reward = group_by([str(round(g[0].get_reward_value(args), 1)) for g in flat])
    return {f"zero_std/count_{r}": len(items) for r, items in by_reward.items()}


def _top_p_kept_vocab_metrics(samples: list[Sample]) -> dict[str, float]:
    kept = tokens = 0
    for s in samples:
        offsets = s.rollout_top_p_token_offsets
        if offsets is None or s.response_length == 0:
            continue
        offsets = torch.as_tensor(offsets, dtype=torch.int64)
        if offsets.numel() == 0 or s.remove_sample:
            continue
        if offsets.numel() != s.response_length + 1:
            raise ValueError(f"top-p token offsets length {offsets.numel()} != response length + 1")
        if s.loss_mask is None:
            kept += int(offsets[-1] - offsets[0])
            tokens += s.response_length
            continue
        mask = torch.as_tensor(s.loss_mask, dtype=torch.bool)
        kept += int(torch.diff(offsets)[mask].sum())
        tokens += int(mask.sum())
    return {"top_p_kept_vocab_per_token": kept / tokens} if tokens else {}


def _spec_metrics(samples: list[Sample]) -> dict[str, float]:
    if not any(s.spec_info.spec_draft_token_num or s.spec_info.spec_verify_ct for s in samples):
        return {}
    n = len(samples)
    return {
        "spec_accept_rate": sum(s.spec_info.spec_accept_rate for s in samples) / n,
        "spec_accept_length": sum(s.spec_info.spec_accept_length for s in samples) / n,
    }


def _prefix_cache_metrics(samples: list[Sample]) -> dict[str, float]:
    cached = sum(s.prefix_cache_info.cached_tokens for s in samples)
    prompt = sum(s.prefix_cache_info.total_prompt_tokens for s in samples)
    return {
        "prefix_cache_hit_rate": cached / prompt if prompt > 0 else 0.0,
        "avg_cached_tokens_per_sample": cached / len(samples),
    }


def _reward_cat_metrics(args: Namespace, samples: list[Sample]) -> dict[str, float]:
    key = args.log_reward_category
    if key is None:
        return {}
    by_cat = group_by(samples, lambda s: s.reward[key])
    return {f"error_cat/{cat}": len(group) / len(samples) for cat, group in by_cat.items()}


def log_eval_rollout_data(
    rollout_id: int, args: Namespace, data: dict[str, Any], extra_metrics: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """`eval/<name>` (mean reward), its sample metrics, truncation and pass@k per eval set, logged
    at `eval/step`; a custom eval log function returning True replaces this."""
    if args.custom_eval_rollout_log_function_path is not None:
        custom = load_function(args.custom_eval_rollout_log_function_path)
        if custom(rollout_id, args, data, extra_metrics):
            return None
    out = extra_metrics or {}
    for key, result in data.items():
        rewards = result["rewards"]
        out[f"eval/{key}"] = sum(rewards) / len(rewards)
        if (samples := result.get("samples")) is not None:
            out |= dict_add_prefix(compute_metrics_from_samples(args, samples), f"eval/{key}/")
        if "truncated" in result:
            out[f"eval/{key}-truncated_ratio"] = sum(result["truncated"]) / len(result["truncated"])
        if args.log_passrate:
            rates = compute_pass_rate(flat_rewards=rewards, group_size=args.n_samples_per_eval_prompt)
            out |= dict_add_prefix(rates, f"eval/{key}-")
    logger.info("eval %s: %s", rollout_id, out)
    out["eval/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, out, step_key="eval/step")
    return out


def log_rollout_data(
    rollout_id: int,
    args: Namespace,
    samples: list[Sample],
    rollout_extra_metrics: dict[str, Any] | None,
    rollout_time: float,
) -> None:
    """`rollout/*` and `perf/*` of the rollout's samples, logged at `rollout/step`; a custom log
    function returning True replaces this, and a replayed rollout (`--load-debug-rollout-data`)
    logs nothing."""
    if args.custom_rollout_log_function_path is not None:
        custom = load_function(args.custom_rollout_log_function_path)
        if custom(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
            return
    if args.load_debug_rollout_data:
        return
    out = {**(rollout_extra_metrics or {})}
    out |= dict_add_prefix(compute_metrics_from_samples(args, samples), "rollout/")
    out |= dict_add_prefix(compute_perf_metrics_from_samples(args, samples, rollout_time), "perf/")
    logger.info("perf %s: %s", rollout_id, out)
    out["rollout/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, out, step_key="rollout/step")
