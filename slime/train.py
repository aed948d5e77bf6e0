"""The RL loop: rollout -> rewards -> advantages -> train -> weight sync, once per rollout id.

    python -m slime.train --hf-checkpoint DIR --prompt-data train.jsonl --rm-type math ...

Every user error is found by `preflight` before Ray or any engine process starts.
"""

from __future__ import annotations

import logging
import sys
from argparse import Namespace
from pathlib import Path
from typing import Callable, Sequence

import ray
from ray.util.placement_group import remove_placement_group
from transformers import AutoTokenizer

from slime.arguments import parse_args, save_args, startup_notes
from slime.arguments.training import custom_config_note
from slime.errors import SlimeError
from slime.observability.ci_checks import check_weight_versions
from slime.observability.metrics import MetricsLogger, tensorboard_dir
from slime.observability.plots import plot_run
from slime.observability.timer import timer
from slime.preflight import preflight
from slime.ray.placement_group import create_placement, init_ray
from slime.ray.rollout import RolloutManager
from slime.ray.train_group import RayTrainGroup
from slime.utils.checkpoint_layout import commit as commit_checkpoint
from slime.utils.progress import StageProgress

logger = logging.getLogger("slime")


def _due(interval: int | None, rollout_id: int, num_rollout: int) -> bool:
    last = rollout_id == num_rollout - 1
    return last or bool(interval and (rollout_id + 1) % interval == 0)


def train(args: Namespace) -> dict[str, float]:
    """Run one training stage; return the last metrics row. `args` come from `parse_args`."""
    preflight(args)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_args(args, run_dir / (f"args.{args.stage}.json" if args.stage else "args.json"))
    print(f"[slime] run directory: {run_dir.resolve()}", flush=True)
    for note in [*startup_notes(args), custom_config_note(args)]:
        if note:
            print(f"[slime] {note}", flush=True)
    metrics_log = MetricsLogger.from_args(args, console=False)  # metrics.jsonl, TensorBoard, wandb

    init_ray(args)
    placement = create_placement(args)
    rollout_manager = RolloutManager.options(num_cpus=0).remote(args, placement)
    actor_model = None if args.debug_rollout_only else RayTrainGroup(args, placement)  # rollout-only: no trainer
    try:
        rollout_ready = rollout_manager.init.remote()  # engines start while the trainer loads its model
        resumed_at = actor_model.init() if actor_model else 0  # the --load checkpoint's rollout + 1, else 0
        ray.get(rollout_ready)
        if args.start_rollout_id is None:  # slime's rule: unset, the loop starts where the checkpoint left off
            args.start_rollout_id = resumed_at
        return _loop(args, rollout_manager, actor_model, metrics_log)
    finally:
        metrics_log.close()
        _release(rollout_manager, actor_model, placement)


def _release(rollout_manager, actor_model: RayTrainGroup | None, placement) -> None:
    """Stop engines, kill this stage's actors and free its placement group."""
    try:
        ray.get(rollout_manager.dispose.remote(), timeout=60)
    except Exception:  # the manager may already be dead; its engines exit with their owner
        pass
    for actor in [*(actor_model.actors if actor_model else []), rollout_manager]:
        ray.kill(actor)
    remove_placement_group(placement.pg)


def _loop(args: Namespace, rollout_manager, actor_model: RayTrainGroup | None,
          metrics_log: MetricsLogger) -> dict[str, float]:
    start_rollout_id = args.start_rollout_id
    # --debug-rollout-only starts no trainer, --debug-train-only no engines: nothing to sync either way
    trains, serves = actor_model is not None, not args.debug_train_only
    if trains and serves:
        # The engines start from the checkpoint on disk; push the trainer's (possibly resumed) weights.
        _sync_weights(args, rollout_manager, actor_model, str(start_rollout_id))

    parity_tokens = _parity_tokens(args) if args.check_weight_update_equal else []
    progress = StageProgress(args.stage or "train", total=args.num_rollout, initial=start_rollout_id)
    last: dict[str, float] = {}
    if serves and args.eval_prompt_data and not args.skip_eval_before_train and start_rollout_id == 0:
        progress.phase("eval")
        last = ray.get(rollout_manager.eval.remote(-1))
        metrics_log.log(0, last)
        progress.note(last)

    for rollout_id in range(start_rollout_id, args.num_rollout):
        metrics: dict[str, float] = {}
        with timer("step", metrics):
            progress.phase("rollout")
            rollout_data_ref, rollout_metrics_ref = rollout_manager.generate.options(num_returns=2).remote(rollout_id)
            metrics.update(_get_rollout_metrics(rollout_metrics_ref, rollout_data_ref))

            if trains:
                if args.colocate:  # the engine frees its KV cache while the trainer uses the cores
                    ray.get(rollout_manager.offload.remote())
                progress.phase("train")
                metrics.update(actor_model.train(rollout_id, rollout_data_ref))
                if args.colocate:
                    ray.get(rollout_manager.onload.remote())

            save_now = trains and _due(args.save_interval, rollout_id, args.num_rollout)
            eval_now = serves and bool(args.eval_prompt_data) and _due(args.eval_interval, rollout_id, args.num_rollout)
            # SFT data never comes from the policy, so the engine needs new weights only to evaluate.
            if trains and serves and (args.loss_type != "sft_loss" or eval_now or rollout_id == args.num_rollout - 1):
                progress.phase("sync")
                metrics.update(_sync_weights(args, rollout_manager, actor_model, str(rollout_id + 1), parity_tokens))

            if save_now:
                progress.phase("save")
                # both sides write into a staging directory; then it is flushed, renamed into place,
                # and only then the tracker names it: a kill at any moment leaves a complete checkpoint
                ckpt = actor_model.save(rollout_id)
                ray.get(rollout_manager.save.remote(rollout_id, ckpt))
                commit_checkpoint(args.save, rollout_id)
            if eval_now:
                progress.phase("eval")
                metrics.update(ray.get(rollout_manager.eval.remote(rollout_id)))

        # Logged after the step: step k's row describes rollout k and the weights it produced.
        metrics_log.log(rollout_id + 1, metrics)
        progress.step(metrics)
        last = metrics

    progress.close()
    return last


def _sync_weights(args: Namespace, rollout_manager, actor_model: RayTrainGroup, version: str,
                  parity_tokens: list[int] | None = None) -> dict[str, float]:
    """The trainer's weights into every live engine (one that died was removed from the router by
    the engine watcher); --check-weight-update-equal and --ci-test check that they arrived."""
    # --use-fault-tolerance: restart dead/hung engines first; a restarted one needs a new weight-update group
    if ray.get(rollout_manager.recover_engines.remote()):
        actor_model.reset_weight_sync()
    actor_model.connect_rollout(ray.get(rollout_manager.get_engine_urls.remote()))
    metrics = {"perf/update_weights_time": actor_model.update_weights(weight_version=version)}
    if parity_tokens:
        metrics["train/weight_sync_logprob_abs_diff"] = max(actor_model.check_weight_parity(parity_tokens).values())
    if args.ci_test:
        check_weight_versions(args, version, ray.get(rollout_manager.weight_versions.remote()))
    return metrics


def _get_rollout_metrics(metrics_ref, data_ref) -> dict[str, float]:
    try:
        return ray.get(metrics_ref)
    except Exception:
        # Both refs carry the same error; consume the second so Ray does not report it again.
        try:
            ray.get(data_ref)
        except Exception:
            pass
        raise


def _parity_tokens(args: Namespace) -> list[int]:
    """A fixed token sequence for the engine/trainer log-prob comparison."""
    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    return tok("The quick brown fox: 12+34=46.", add_special_tokens=False)["input_ids"]


def finish_run(args: Namespace) -> None:
    """Plot the run and say where everything is."""
    run_dir = Path(args.run_dir)
    png = plot_run(run_dir / "metrics.jsonl", run_dir / "metrics.png")
    print(f"[slime] metrics: {(run_dir / 'metrics.jsonl').resolve()}")
    print(f"[slime] plot:    {png.resolve()}")
    if args.use_tensorboard:
        print(f"[slime] tensorboard --logdir {tensorboard_dir(args).resolve()}")


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def run_cli(body: Callable[[], None]) -> int:
    """Run a command's body the way every `slime` command ends: a user error is one line
    (no traceback), Ctrl-C stops cleanly, and Ray (with every actor and engine) always stops."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        body()
        return 0
    except SlimeError as e:
        # Raised inside an actor, it arrives wrapped in Ray's remote traceback: print the cause.
        print(f"slime: error: {getattr(e, 'cause', None) or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slime: interrupted; stopping engines and actors", file=sys.stderr)
        return 130
    finally:
        shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> None:
        args = parse_args(argv)
        train(args)
        finish_run(args)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
