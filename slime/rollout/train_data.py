"""Rollout groups -> the columns the trainer consumes, plus rollout metrics.

Reward post-processing (GRPO's group normalisation) lives here, on the rollout side, as in
slime: a group must be normalised as a whole before the batch is split over trainer ranks.
A FAILED or ABORTED sample, or one a `--rollout-sample-filter-path` hook marked
`remove_sample`, stays in the batch (so groups keep their shape and it is counted) but its loss
mask is all zeros: it is never trained on. A FAILED or ABORTED sample has no reward, so it is also
out of every statistic (`statistics_mask`): its group's mean and std, `rollout/raw_reward`, and
(train column `excluded`) the trainer's sample average of the loss; a group left with fewer than two
valid samples is dropped whole and counted in `rollout/dropped_groups`.
"""

from __future__ import annotations

import itertools
import math
from argparse import Namespace
from typing import Any

import torch

from slime.algorithms.advantages import dapo_overlong_penalty, drop_thin_groups, group_normalize_rewards, rloo_rewards
from slime.errors import SlimeError
from slime.utils.misc import load_function
from slime.utils.types import Sample

NOT_TRAINABLE = (Sample.Status.FAILED, Sample.Status.ABORTED)
GROUP_ESTIMATORS = ("grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus_baseline")  # baseline from the group


def statistics_mask(args: Namespace, samples: list[Sample]) -> tuple[list[bool], int]:
    """Which samples enter the statistics (group mean and std, advantage whitening, loss averages),
    and how many groups were dropped. A FAILED or ABORTED sample never does: its reward is no reward.
    With a group baseline (grpo, gspo, cispo, rloo, reinforce_plus_plus_baseline, normalised), a group
    left with fewer than 2 valid samples is dropped whole (the train column `excluded` marks all of
    these; their loss masks are zeros)."""
    valid = [s.status not in NOT_TRAINABLE for s in samples]
    g = args.n_samples_per_prompt
    grouped = (
        args.loss_type != "sft_loss"
        and args.rewards_normalization
        and args.advantage_estimator in GROUP_ESTIMATORS
        and g > 1
    )
    sizes = prompt_group_sizes(samples, g)
    if all(valid) or not grouped or (sizes is None and len(samples) % g != 0):
        return valid, 0
    out, dropped = [], 0
    for part, n in _groups(valid, sizes, g):  # groups of several sizes: each judged on its own samples
        kept, thin = drop_thin_groups(part, n)
        out += [bool(v) for v in kept.tolist()]
        dropped += thin
    return out, dropped


def _groups(values: list, sizes: list[int] | None, n_samples_per_prompt: int) -> list[tuple[list, int]]:
    """`values` cut into prompt groups, with each group's size: `sizes`, or one piece of groups of n."""
    if sizes is None:
        return [(values, n_samples_per_prompt)]
    starts = itertools.accumulate(sizes, initial=0)  # one more than sizes: the last is the end
    return [(values[start : start + n], n) for start, n in zip(starts, sizes, strict=False)]


def prompt_group_sizes(samples: list[Sample], n_samples_per_prompt: int) -> list[int] | None:
    """The sizes of the prompt groups (consecutive samples with one `group_index`) when they are not all
    `n_samples_per_prompt`, else None. A generate hook may return several samples for one (an agent
    session whose history was rewritten becomes one sample per segment), so a group can hold more
    than n samples; newer slime normalises such groups one by one, as here."""
    if not samples or any(s.group_index is None for s in samples):
        return None
    sizes: list[int] = []
    last = object()
    for s in samples:
        if s.group_index == last:
            sizes[-1] += 1
        else:
            sizes.append(1)
            last = s.group_index
    return None if all(n == n_samples_per_prompt for n in sizes) else sizes


def post_process_rewards(args: Namespace, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards the trainer uses), slime's ``_post_process_rewards``.

    The DAPO overlong penalty (``--overlong-buffer-len``) is added first; then, per prompt group,
    grpo / gspo subtract the mean and divide by the std (mean only with
    ``--disable-grpo-std-normalization``), reinforce_plus_plus_baseline subtracts the mean, rloo
    subtracts the mean of the *other* samples. ``--disable-rewards-normalization`` skips the group
    step; ppo and reinforce_plus_plus always see the (penalised) rewards.
    """
    raw = [s.get_reward_value(args) if s.status not in NOT_TRAINABLE else 0.0 for s in samples]
    valid, _ = statistics_mask(args, samples)  # FAILED samples (and dropped groups) stay out of mean and std
    if args.loss_type == "sft_loss":
        return raw, raw
    rewards = list(raw)
    if args.overlong_buffer_len:
        penalty = dapo_overlong_penalty(
            [s.response_length for s in samples],
            args.rollout_max_response_len,
            args.overlong_buffer_len,
            args.overlong_penalty_factor,
        )
        rewards = [r + p for r, p in zip(rewards, penalty, strict=True)]
    est, g = args.advantage_estimator, args.n_samples_per_prompt
    if not args.rewards_normalization or est in ("ppo", "reinforce_plus_plus"):
        return raw, rewards
    sizes = prompt_group_sizes(samples, g)  # None: every group has n samples
    out = []
    for (chunk, size), (ok, _) in zip(_groups(rewards, sizes, g), _groups(valid, sizes, g), strict=True):
        chunk = torch.tensor(chunk, dtype=torch.float32)
        if est in ("grpo", "gspo", "cispo"):  # cispo takes grpo's advantages
            out.append(group_normalize_rewards(chunk, size, std_normalization=args.grpo_std_normalization, valid=ok))
        elif est == "reinforce_plus_plus_baseline":
            out.append(group_normalize_rewards(chunk, size, std_normalization=False, valid=ok))
        elif est == "rloo":
            out.append(rloo_rewards(chunk, size, valid=ok))
        else:
            out.append(chunk)
    return raw, torch.cat(out).tolist()


def _hook(args: Namespace, name: str):
    path = getattr(args, name)
    if not path:
        return None
    return load_function(path, arg_name="--" + name.replace("_", "-"))


def samples_to_train_data(args: Namespace, groups: list[list[Sample]]) -> dict[str, Any]:
    """Train columns. `--custom-convert-samples-to-train-data-path` replaces the whole conversion,
    rewards included (`fn(args, samples) -> dict`), `--custom-reward-post-process-path` only the
    reward step (`fn(args, samples) -> (raw_rewards, rewards)`), as in slime."""
    samples = [s for g in groups for s in g]
    convert_hook = _hook(args, "custom_convert_samples_to_train_data_path")
    if convert_hook is not None:
        return _converted(args, samples, convert_hook(args, samples))
    reward_hook = _hook(args, "custom_reward_post_process_path")
    if reward_hook is not None:
        raw_rewards, rewards = reward_hook(args, samples)
        raw_rewards, rewards = [float(r) for r in raw_rewards], [float(r) for r in rewards]
        if len(raw_rewards) != len(samples) or len(rewards) != len(samples):
            raise SlimeError(
                f"--custom-reward-post-process-path {args.custom_reward_post_process_path} returned "
                f"{len(raw_rewards)} raw rewards and {len(rewards)} rewards for {len(samples)} samples"
            )
    else:
        raw_rewards, rewards = post_process_rewards(args, samples)
    valid, _ = statistics_mask(args, samples)
    loss_masks = []
    for s, ok in zip(samples, valid, strict=True):
        mask = list(s.loss_mask) if s.loss_mask is not None else [1] * s.response_length
        if len(mask) != s.response_length:
            raise ValueError(
                f"sample {s.index}: loss_mask has {len(mask)} entries but response_length is {s.response_length}"
            )
        loss_masks.append([0] * len(mask) if not ok or s.remove_sample else mask)
    data: dict[str, Any] = {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": loss_masks,
        "rewards": rewards,
        "raw_reward": raw_rewards,
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
        "sample_indices": [s.index for s in samples],
        "excluded": [int(not ok) for ok in valid],  # out of every average (FAILED, or a dropped group)
    }
    if all(s.rollout_log_probs is not None for s in samples):
        data["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]
    # On-policy distillation with a served teacher (--opd-type sglang): a hook fills these.
    teacher = [
        s.teacher_log_probs if s.teacher_log_probs is not None else (s.train_metadata or {}).get("teacher_log_probs")
        for s in samples
    ]
    if samples and all(t is not None for t in teacher):  # a list or a tensor (slime's hooks set tensors)
        data["teacher_log_probs"] = [[float(x) for x in t] for t in teacher]
    return data


TRAIN_COLUMNS = ("tokens", "response_lengths", "loss_masks", "rewards")  # what the trainer reads of every sample


def _converted(args: Namespace, samples: list[Sample], data: Any) -> dict[str, Any]:
    """Check a convert hook's train data; FAILED, ABORTED and removed samples are never trained on,
    whatever the hook wrote for them; `raw_reward` / `truncated` (for metrics) are filled if absent."""
    where = f"--custom-convert-samples-to-train-data-path {args.custom_convert_samples_to_train_data_path}"
    if not isinstance(data, dict):
        raise SlimeError(f"{where} returned {type(data).__name__}, not a dict of train columns")
    missing = [k for k in TRAIN_COLUMNS if k not in data]
    if missing:
        raise SlimeError(f"{where} returned no {', '.join(missing)} (the trainer needs {', '.join(TRAIN_COLUMNS)})")
    wrong = [k for k in TRAIN_COLUMNS if len(data[k]) != len(samples)]
    if wrong:
        raise SlimeError(f"{where}: {', '.join(wrong)} must have one entry per sample ({len(samples)})")
    for i, s in enumerate(samples):
        if s.status in NOT_TRAINABLE or s.remove_sample:
            data["loss_masks"][i] = [0] * len(data["loss_masks"][i])
    data.setdefault("raw_reward", list(data["rewards"]))
    data.setdefault("truncated", [int(s.status == Sample.Status.TRUNCATED) for s in samples])
    data["excluded"] = [int(s.status in NOT_TRAINABLE) for s in samples]
    return data


def rollout_metrics(args: Namespace, groups: list[list[Sample]], data: dict[str, Any]) -> dict[str, float]:
    samples = [s for g in groups for s in g]
    n = max(1, len(samples))
    lengths = data["response_lengths"]
    metrics = {
        "rollout/response_len/mean": sum(lengths) / n,
        "rollout/response_len/max": float(max(lengths, default=0)),
        "rollout/truncated_ratio": sum(data["truncated"]) / n,
        "rollout/num_samples": float(len(samples)),
    }
    if args.loss_type != "sft_loss":  # SFT samples are not graded: no reward to report
        # FAILED samples have no reward: the mean is over the others
        scored = [r for r, s in zip(data["raw_reward"], samples, strict=True) if s.status not in NOT_TRAINABLE]
        metrics["rollout/raw_reward"] = sum(scored) / max(1, len(scored))
        metrics["rollout/dropped_groups"] = float(statistics_mask(args, samples)[1])
        if args.overlong_buffer_len:
            penalty = dapo_overlong_penalty(
                lengths, args.rollout_max_response_len, args.overlong_buffer_len, args.overlong_penalty_factor
            )
            metrics["rollout/overlong_penalty"] = sum(penalty) / n
    metrics["rollout/removed_samples"] = float(sum(s.remove_sample for s in samples))
    # A bounded grader refused or timed out (score 0, reason in metadata): a policy that learns
    # to produce such answers shows up here first.
    metrics["rollout/reward_refused"] = float(
        sum(isinstance(s.metadata, dict) and "reward_error" in s.metadata for s in samples)
    )
    for status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED, Sample.Status.FAILED):
        metrics[f"rollout/status/{status.value}"] = float(sum(s.status == status for s in samples))
    # Groups whose rewards are all equal give GRPO zero advantage: worth watching.
    if args.n_samples_per_prompt > 1:
        flat = [
            len({round(s.get_reward_value(args), 9) for s in g if s.status not in NOT_TRAINABLE}) == 1
            for g in groups
            if any(s.status not in NOT_TRAINABLE for s in g)
        ]
        metrics["rollout/zero_std_group_ratio"] = sum(flat) / max(1, len(flat))
    metrics.update(optional_rollout_metrics(args, groups, data))
    return metrics


def optional_rollout_metrics(args: Namespace, groups: list[list[Sample]], data: dict[str, Any]) -> dict[str, float]:
    """slime's --log-passrate, --log-reward-category, --log-multi-turn and --log-correct-samples, with
    slime's keys. slime computes some of them on each trainer rank and averages over ranks; here they
    are computed once over the whole rollout (what slime reports with one data-parallel rank)."""
    samples = [s for g in groups for s in g]
    out: dict[str, float] = {}
    if not samples:
        return out
    if args.log_passrate:
        sizes = [len(g) for g in groups]
        flat = [float(r) for r in data["raw_reward"]]
        per_prompt = [flat[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(sizes))]
        out.update({f"passrate/{k}": v for k, v in pass_rate(per_prompt).items()})
    if args.log_reward_category:
        out.update(reward_category_metrics(args.log_reward_category, samples, "rollout/"))
    if args.log_multi_turn:
        out.update(multi_turn_metrics(args, samples, data["loss_masks"]))
    if args.log_correct_samples:
        out.update(correct_sample_metrics(args, data))
    return out


def pass_rate(rewards_by_prompt: list[list[float]]) -> dict[str, float]:
    """slime's compute_pass_rate: `pass@k` for k = 1, 2, 4, ... up to the samples per prompt, averaged
    over prompts; a sample is correct when its reward is exactly 1. Nothing with one sample per prompt."""
    n = min((len(g) for g in rewards_by_prompt), default=0)
    out: dict[str, float] = {}
    k = 1
    while n > 1 and k <= n:
        out[f"pass@{k}"] = sum(pass_at_k(len(g), sum(r == 1 for r in g), k) for g in rewards_by_prompt) / len(
            rewards_by_prompt
        )
        k *= 2
    return out


def reward_category_metrics(key: str, samples: list[Sample], prefix: str) -> dict[str, float]:
    """`<prefix>error_cat/<value>`: the fraction of all samples whose reward dict holds that value
    under `key` (slime's --log-reward-category). A sample without it (FAILED: no reward) is in no
    category, so the fractions then sum to less than 1."""
    counts: dict[str, int] = {}
    for s in samples:
        if isinstance(s.reward, dict) and key in s.reward:
            cat = str(s.reward[key])
            counts[cat] = counts.get(cat, 0) + 1
    return {f"{prefix}error_cat/{cat}": c / len(samples) for cat, c in counts.items()}


def _spread(prefix: str, values: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_mean": sum(values) / len(values),
        f"{prefix}_max": float(max(values)),
        f"{prefix}_min": float(min(values)),
    }


def multi_turn_metrics(args: Namespace, samples: list[Sample], loss_masks: list[list[int]]) -> dict[str, float]:
    """slime's --log-multi-turn: response lengths with observation (tool) tokens (`raw_response_length`,
    the loss mask's length) and without them (`wo_obs_response_length`, its sum), and the rounds a
    sample took when its generate function records `metadata["round_number"]`. `clip_ratio` (responses
    at --rollout-max-response-len) needs that option set."""
    raw = [float(len(m)) for m in loss_masks]
    out = _spread("multi_turn/raw_response_length/response_length", raw)
    if args.rollout_max_response_len is not None:
        out["multi_turn/raw_response_length/response_length_clip_ratio"] = sum(
            r >= args.rollout_max_response_len for r in raw
        ) / len(raw)
    out.update(_spread("multi_turn/wo_obs_response_length/response_length", [float(sum(m)) for m in loss_masks]))
    rounds = [float(s.metadata["round_number"]) for s in samples if "round_number" in (s.metadata or {})]
    if rounds:
        out.update(_spread("multi_turn/multi_turn_metric/round_number", rounds))
    return out


def correct_sample_metrics(args: Namespace, data: dict[str, Any]) -> dict[str, float]:
    """slime's --log-correct-samples over the samples whose raw reward is 1:
    `rollout/correct_length/p25..p100`, the fraction of them whose response length falls in each
    quarter of --rollout-max-response-len (needs that option), and `rollout/correct_entropy`, the mean
    over them of each response's mean -log p of its trained tokens (the engine's log-probs here)."""
    correct = [i for i, r in enumerate(data["raw_reward"]) if r == 1]
    out: dict[str, float] = {}
    if not correct:
        return out
    limit = args.rollout_max_response_len
    if limit is not None:
        cuts = [limit * q / 4 for q in (1, 2, 3)] + [limit]
        counts = [0] * 4
        for i in correct:
            bucket = next((b for b, cut in enumerate(cuts) if data["response_lengths"][i] <= cut), None)
            if bucket is not None:  # longer than the limit: in no quarter (as slime's)
                counts[bucket] += 1
        total = sum(counts)
        out.update(
            {f"rollout/correct_length/p{25 * (b + 1)}": c / total if total else 0.0 for b, c in enumerate(counts)}
        )
    log_probs = data.get("rollout_log_probs")
    if log_probs is not None:
        per_sample = []
        for i in correct:
            mask = data["loss_masks"][i]
            per_sample.append(-sum(lp * m for lp, m in zip(log_probs[i], mask, strict=True)) / max(1, sum(mask)))
        out["rollout/correct_entropy"] = sum(per_sample) / len(per_sample)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `c` correct answers among `n` samples:
    1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without replacement hold a correct one."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_metrics(name: str, samples: list[Sample], rewards: list[float]) -> dict[str, float]:
    """`eval/<name>/pass@k` for k = 1, 2, 4, ... up to the samples per prompt; a sample is
    correct when its reward is > 0. Prompts are told apart by `group_index`."""
    by_prompt: dict[Any, list[bool]] = {}
    for s, r in zip(samples, rewards, strict=True):
        by_prompt.setdefault(s.group_index, []).append(r > 0)
    if not by_prompt:
        return {}
    n = min(len(v) for v in by_prompt.values())
    out = {}
    k = 1
    while k <= n:
        out[f"eval/{name}/pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in by_prompt.values()) / len(by_prompt)
        k *= 2
    return out


def _rewards_per_prompt(samples: list[Sample], rewards: list[float], n: int) -> list[list[float]]:
    """Each prompt's rewards: by the samples' group_index (an --eval-config data set may have its own
    n_samples_per_eval_prompt), else slime's consecutive runs of n."""
    if samples and len(samples) == len(rewards) and all(s.group_index is not None for s in samples):
        groups: dict[int, list[float]] = {}
        for s, r in zip(samples, rewards, strict=True):
            groups.setdefault(s.group_index, []).append(r)
        sizes = {len(g) for g in groups.values()}
        return list(groups.values()) if len(sizes) == 1 else []
    return [list(rewards[i : i + n]) for i in range(0, len(rewards), n)] if len(rewards) % n == 0 else []


def eval_metrics(args: Namespace, results: dict[str, dict[str, Any]]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name, res in results.items():
        rewards = res["rewards"]
        metrics[f"eval/{name}"] = sum(rewards) / max(1, len(rewards))
        samples = res.get("samples") or []
        if samples and len(samples) == len(rewards) and all(s.group_index is not None for s in samples):
            metrics.update(pass_at_k_metrics(name, samples, rewards))
        if samples:
            metrics[f"eval/{name}/response_len/mean"] = sum(s.response_length for s in samples) / len(samples)
            metrics[f"eval/{name}/failed"] = float(sum(s.status == Sample.Status.FAILED for s in samples))
            if args.log_reward_category:
                metrics.update(reward_category_metrics(args.log_reward_category, samples, f"eval/{name}/"))
        if "dropped_long_prompts" in res:  # prompts over --eval-max-prompt-len, counted, never silently lost
            metrics[f"eval/{name}/dropped_long_prompts"] = float(res["dropped_long_prompts"])
        if args.log_passrate and rewards:
            per_prompt = _rewards_per_prompt(samples, rewards, args.n_samples_per_eval_prompt)
            if per_prompt:
                metrics.update({f"eval/{name}-{k}": v for k, v in pass_rate(per_prompt).items()})
    return metrics
