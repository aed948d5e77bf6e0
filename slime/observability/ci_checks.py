"""slime's `--ci-test` checks and `--ci-save-grad-norm` / `--ci-load-grad-norm`.

With `--ci-test` (slime's checks, `slime/backends/megatron_utils/model.py` and
`slime/ray/actor_group.py`):

* the first optimizer step of every rollout is on-policy: `train/ppo_kl` < 1e-8 (when the step
  reports `train/pg_clipfrac` too), and at the run's first step `train/kl_loss` < 1e-8: the policy
  is still the reference (both off with `--ci-disable-kl-checker`);
* `train/train_rollout_logprob_abs_diff` <= `--ci-train-rollout-logprob-abs-diff-threshold`;
* after every weight update each engine's `weight_version` is the one the trainer sent.

`--ci-save-grad-norm PATTERN` saves each step's grad norm to `PATTERN.format(role=, rollout_id=,
step_id=)`; `--ci-load-grad-norm PATTERN` compares each step's with the saved one (rel/abs 0.01).

A failed check stops the run: `SlimeError` with a report (the check, the value, the limit, the
step's metrics), also written to `<run-dir>/ci_failure.json`.
"""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

from slime.errors import SlimeError

ON_POLICY_KL_LIMIT = 1e-8  # slime's bound on the first step's ppo_kl and the first kl_loss
GRAD_NORM_TOLERANCE = 0.01  # slime's rel_tol = abs_tol for --ci-load-grad-norm


def fail(args: Namespace, check: str, where: str, detail: str, metrics: dict[str, Any] | None = None) -> None:
    report = {"check": check, "where": where, "detail": detail, "metrics": metrics or {}}
    try:
        path = Path(args.run_dir) / "ci_failure.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
        saved = f" (report: {path})"
    except OSError:
        saved = ""
    shown = ", ".join(
        f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted((metrics or {}).items())
    )
    raise SlimeError(
        f"--ci-test check failed: {check} at {where}: {detail}" + (f"; metrics: {shown}" if shown else "") + saved
    )


def check_train_step(args: Namespace, rollout_id: int, step_id: int, metrics: dict[str, float]) -> None:
    """The on-policy checks on one optimizer step's metrics (this rank's)."""
    if not args.ci_test or args.ci_disable_kl_checker:
        return
    where = f"rollout {rollout_id} step {step_id}"
    if step_id == 0 and "train/ppo_kl" in metrics and "train/pg_clipfrac" in metrics:
        if not metrics["train/ppo_kl"] < ON_POLICY_KL_LIMIT:
            fail(
                args,
                "first step's train/ppo_kl",
                where,
                f"train/ppo_kl = {metrics['train/ppo_kl']:.6g}, must be < {ON_POLICY_KL_LIMIT:g} (the old "
                f"log-probs are the policy's own before its first step)",
                metrics,
            )
    if rollout_id == 0 and step_id == 0 and "train/kl_loss" in metrics:
        if not metrics["train/kl_loss"] < ON_POLICY_KL_LIMIT:
            fail(
                args,
                "first train/kl_loss",
                where,
                f"train/kl_loss = {metrics['train/kl_loss']:.6g}, must be < {ON_POLICY_KL_LIMIT:g} (the policy "
                f"is the reference before the first step)",
                metrics,
            )


def check_logprob_diff(args: Namespace, rollout_id: int, metrics: dict[str, float]) -> None:
    key = "train/train_rollout_logprob_abs_diff"
    if not args.ci_test or key not in metrics:
        return
    limit = args.ci_train_rollout_logprob_abs_diff_threshold
    if not metrics[key] <= limit:
        fail(
            args,
            key,
            f"rollout {rollout_id}",
            f"{key} = {metrics[key]:.6g} exceeds --ci-train-rollout-logprob-abs-diff-threshold {limit:g}",
            metrics,
        )


def check_weight_versions(args: Namespace, expected: str, versions: dict[str, Any]) -> None:
    """Every engine serves the weight version the trainer just sent."""
    if not args.ci_test:
        return
    wrong = {url: v for url, v in versions.items() if str(v) != str(expected)}
    if wrong:
        fail(
            args,
            "engine weight_version",
            f"weight update to version {expected}",
            "engines report another version: " + ", ".join(f"{u}: {v!r}" for u, v in wrong.items()),
        )


def grad_norm_path(pattern: str, rollout_id: int, step_id: int, role: str = "actor") -> Path:
    return Path(pattern.format(role=role, rollout_id=rollout_id, step_id=step_id))


def save_or_check_grad_norm(
    args: Namespace, rollout_id: int, step_id: int, grad_norm: float, writer: bool, role: str = "actor"
) -> None:
    """`--ci-save-grad-norm` (the writing rank) / `--ci-load-grad-norm` (every rank)."""
    if args.ci_save_grad_norm is not None:
        if writer:
            path = grad_norm_path(args.ci_save_grad_norm, rollout_id, step_id, role)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(grad_norm, path)
    elif args.ci_load_grad_norm is not None:
        path = grad_norm_path(args.ci_load_grad_norm, rollout_id, step_id, role)
        where = f"rollout {rollout_id} step {step_id}"
        if not path.is_file():
            fail(args, "--ci-load-grad-norm", where, f"no saved grad norm {path}")
        expected = float(torch.load(path, weights_only=True))
        if not math.isclose(grad_norm, expected, rel_tol=GRAD_NORM_TOLERANCE, abs_tol=GRAD_NORM_TOLERANCE):
            fail(
                args,
                "--ci-load-grad-norm",
                where,
                f"grad norm {grad_norm:.6g} differs from the saved {expected:.6g} ({path}) by more than "
                f"{GRAD_NORM_TOLERANCE:g} (relative and absolute)",
                {"train/grad_norm": grad_norm},
            )
