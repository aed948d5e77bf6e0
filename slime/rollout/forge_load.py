"""Replay a saved rollout while the engines stay up (slime's `slime.rollout.forge_load`).

    --rollout-function-path slime.rollout.forge_load.generate_rollout
    --load-forge-rollout-data dumps/{rollout_id}.pt      (or one literal file for every rollout)

The files are `--save-debug-rollout-data`'s (slime's format). Unlike `--load-debug-rollout-data`,
this does not imply `--debug-train-only`: engines, router, weight sync and the colocated
offload/onload all still run, which is what slime uses it for (measuring memory with real
engines on fixed data). slime's path rules: a path without `{rollout_id}` is reused for every
rollout (and evaluation returns nothing); with it, rollout N reads `N.pt`, falling back to `0.pt`
for training (never for evaluation), and evaluation reads `eval_N.pt` when it exists.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

from slime.errors import SlimeError
from slime.observability.debug_data import read_samples, regroup
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def forge_path(args: Namespace, rollout_id: int, evaluation: bool) -> Path | None:
    pattern = args.load_forge_rollout_data
    if not pattern:
        raise SlimeError(
            "slime.rollout.forge_load needs --load-forge-rollout-data PATH (a file, or a "
            "pattern with {rollout_id}, as --save-debug-rollout-data wrote)"
        )
    if "{rollout_id}" not in pattern:
        return None if evaluation else Path(pattern)
    path = Path(pattern.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))
    if path.exists() or evaluation:
        return path if path.exists() else None
    fallback = Path(pattern.format(rollout_id="0"))
    logger.info("forge_load: %s missing, replaying %s", path, fallback)
    return fallback


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False):
    path = forge_path(args, rollout_id, evaluation)
    if evaluation:
        if path is None:
            return RolloutFnEvalOutput(data={})
        samples = read_samples(path, rollout_id, "--load-forge-rollout-data")
        return RolloutFnEvalOutput(
            data={
                "forge_eval": {
                    "rewards": [s.get_reward_value(args) if s.reward is not None else 0.0 for s in samples],
                    "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
                    "samples": samples,
                }
            }
        )
    samples = read_samples(path, rollout_id, "--load-forge-rollout-data")
    return RolloutFnTrainOutput(samples=regroup(samples, args.n_samples_per_prompt))
