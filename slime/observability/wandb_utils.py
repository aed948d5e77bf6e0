"""slime's `slime.observability.wandb_utils`: start the run's wandb run (primary) or join it from
another process (secondary).

`init_wandb_primary` is `slime.observability.wandb_sink.WandbSink.from_args` (mode from
`--wandb-mode`, $WANDB_MODE, the key and the host; the run id kept in the run directory; sets
`args.wandb_run_id`), plus slime's step metrics. `init_wandb_secondary` joins the run named by
`args.wandb_run_id`, as slime's: wandb's shared mode online, the same id offline.
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from typing import Any

from slime.observability.wandb_sink import WandbSink, _config, resolve_mode

__all__ = ["init_wandb_primary", "init_wandb_secondary"]

logger = logging.getLogger(__name__)

# the primary run's sink in this process (finish_tracking closes it)
_primary: dict[str, WandbSink] = {}

# slime's x-axes: each family of metrics is plotted against its own step key
STEP_METRICS = {
    "train/*": "train/step",
    "rollout/*": "rollout/step",
    "multi_turn/*": "rollout/step",
    "passrate/*": "rollout/step",
    "eval/*": "eval/step",
    "perf/*": "rollout/step",
}


def _is_offline_mode(args: Namespace) -> bool:
    """`--wandb-mode offline`, or without `--wandb-mode` WANDB_MODE=offline."""
    if args.wandb_mode:
        return args.wandb_mode == "offline"
    return os.environ.get("WANDB_MODE") == "offline"


def _init_wandb_common(run: Any) -> None:
    for step_key in sorted(set(STEP_METRICS.values())):
        run.define_metric(step_key)
    for pattern, step_key in STEP_METRICS.items():
        run.define_metric(pattern, step_metric=step_key)


def init_wandb_primary(args: Namespace) -> None:
    """Start (or resume) the run with `--use-wandb`; without it `args.wandb_run_id = None`."""
    if not args.use_wandb:
        args.wandb_run_id = None
        return
    sink = WandbSink.from_args(args, args.run_dir)
    assert sink is not None
    _primary["sink"] = sink
    _init_wandb_common(sink.run)


def _compute_secondary_config_for_logging(args: Namespace, role: str | None = None) -> dict[str, Any]:
    config = _config(args)
    if role == "critic":
        return {f"critic/{k}": v for k, v in config.items()}
    return config


def init_wandb_secondary(args: Namespace, role: str | None = None) -> None:
    """Join the primary's run (`args.wandb_run_id`) from this process; nothing without an id."""
    if args.wandb_run_id is None:
        return
    import wandb  # lazily: 1 s to import, only with --use-wandb

    mode, _ = resolve_mode(args.wandb_mode, args.wandb_key, args.wandb_host)
    if mode == "online":
        settings = wandb.Settings(mode="shared", x_primary=False, x_update_finish_state=False)
    else:
        settings = wandb.Settings(mode=mode)
    directory = args.wandb_dir or os.environ.get("WANDB_DIR") or args.run_dir
    os.makedirs(directory, exist_ok=True)
    run = wandb.init(
        id=args.wandb_run_id,
        entity=args.wandb_team,
        project=args.wandb_project,
        config=_compute_secondary_config_for_logging(args, role=role),
        resume="allow",
        reinit="create_new",
        dir=str(directory),
        settings=settings,
        allow_val_change=True,
    )
    _init_wandb_common(run)
