"""slime's `slime.observability.logging_utils`: the logger format, and `log(args, metrics,
step_key)`, what slime's custom log functions call to report metrics.

`log` writes to every sink this process has: the wandb run (`--use-wandb`, when this process
started or joined it with `init_tracking`), TensorBoard (`--use-tensorboard`, through
`tensorboard_utils._TensorboardAdapter`), and always one JSON line in
`<run-dir>/hook_metrics.jsonl` (`{"step_key", "step", **metrics}`), so a hook's metrics are kept
whichever process logs them (the trainer's own metrics are in `metrics.jsonl`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from argparse import Namespace
from pathlib import Path
from typing import Any

from slime.observability import wandb_utils
from slime.observability.tensorboard_utils import _TensorboardAdapter

__all__ = ["configure_logger", "init_tracking", "finish_tracking", "log", "HOOK_METRICS_FILE"]

HOOK_METRICS_FILE = "hook_metrics.jsonl"

_configured = threading.Event()
_write_lock = threading.Lock()
_noted_no_run = threading.Event()


def configure_logger(prefix: str = "") -> None:
    """Root logging at INFO with slime's format `[time<prefix>] file:line - message`; once per process."""
    if _configured.is_set():
        return
    _configured.set()
    logging.basicConfig(
        level=logging.INFO,
        format=f"[%(asctime)s{prefix}] %(filename)s:%(lineno)d - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )


def init_tracking(args: Namespace, primary: bool = True, **kwargs: Any) -> None:
    """Start the run's wandb run (primary) or join it (secondary, e.g. `role="critic"`)."""
    if primary:
        wandb_utils.init_wandb_primary(args, **kwargs)
    else:
        wandb_utils.init_wandb_secondary(args, **kwargs)


def finish_tracking(args: Namespace) -> None:
    """Finish this process's wandb run (a failure is logged, not raised)."""
    if not args.use_wandb:
        return
    sink = wandb_utils._primary.pop("sink", None)
    if sink is not None:
        sink.close()
        return
    import wandb

    try:
        if wandb.run is not None:
            wandb.finish()
    except Exception:
        logging.getLogger(__name__).exception("Failed to finish wandb run")


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _append_jsonl(args: Namespace, metrics: dict[str, Any], step_key: str) -> None:
    path = Path(args.run_dir) / HOOK_METRICS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"step_key": step_key, "step": _plain(metrics[step_key])}
    record.update({k: _plain(v) for k, v in metrics.items() if k != step_key})
    line = json.dumps(record, ensure_ascii=False, default=str)
    with _write_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def log(args: Namespace, metrics: dict[str, Any], step_key: str) -> None:
    """Report `metrics` at step `metrics[step_key]` to this process's sinks (see the module doc)."""
    if step_key not in metrics:
        raise KeyError(f"log: the metrics have no step key {step_key!r}")
    _append_jsonl(args, metrics, step_key)
    if args.use_wandb:
        import wandb

        if wandb.run is not None:
            wandb.run.log(dict(metrics))
        elif not _noted_no_run.is_set():
            _noted_no_run.set()
            print(
                f"[slime] logging_utils.log: no wandb run in this process (init_tracking(args, primary=False) "
                f"joins the run); the metrics are in {Path(args.run_dir) / HOOK_METRICS_FILE}",
                flush=True,
            )
    if args.use_tensorboard:
        scalars = {k: v for k, v in metrics.items() if k != step_key}
        _TensorboardAdapter(args).log(data=scalars, step=metrics[step_key])
