"""The RL loop: rollout -> rewards -> advantages -> train -> weight sync, once per rollout id.

    python -m slime.train --hf-checkpoint DIR --prompt-data train.jsonl --rm-type math ...

One loop serves both of slime's entry points: it takes a bound on the policy lag, how many
rollouts may be generated ahead of the step that trains (0: synchronous, this module; 1:
`slime.train_async`, where rollout k+1 is generated while step k trains).

Every user error is found by `preflight` before Ray or any engine process starts.
"""

from __future__ import annotations

import logging
import sys
import time
from argparse import Namespace
from collections.abc import Callable, Sequence
from pathlib import Path

import ray
from ray.util.placement_group import remove_placement_group
from transformers import AutoTokenizer

from slime.arguments import parse_args, save_args, startup_notes
from slime.arguments.training import custom_config_note
from slime.errors import SlimeError
from slime.observability.ci_checks import check_weight_versions
from slime.observability.metrics import MetricsLogger, tensorboard_dir
from slime.observability.plots import plot_run
from slime.observability.report import report_run
from slime.observability.run_dir import args_path
from slime.observability.timer import timer
from slime.preflight import count_prompts, preflight
from slime.ray.placement_group import create_placement, init_ray
from slime.ray.rollout import RolloutManager
from slime.ray.train_group import RayTrainGroup
from slime.sync.shm import buffers as shm_buffers
from slime.sync.shm import remove_stale_buffers
from slime.utils.checkpoint_layout import commit as commit_checkpoint
from slime.utils.checkpoint_layout import latest_checkpoint_note, latest_dir
from slime.utils.misc import should_run_periodic_action
from slime.utils.progress import StageProgress

logger = logging.getLogger("slime")

# Whether a run in this process started the Ray session (`slime train` does): `shutdown` stops only
# that one. A session that was up before the run (a program's own ray.init, a test session's shared
# cluster) is its starter's; the run releases what it created (`_release`) and leaves it running.
_ray_started_here = False


def train(args: Namespace, max_lag: int = 0) -> dict[str, float]:
    """Run one training stage; return the last metrics row. `args` come from `parse_args`;
    `max_lag` rollouts may be generated ahead of training (0: synchronous)."""
    if max_lag and args.colocate:  # slime: "Colocation is not supported for async training."
        raise SlimeError(
            "--colocate cannot run with train_async (slime's rule): colocated, the engines and the "
            "trainer take turns on the same resources, so a rollout cannot be generated while a step "
            "trains; drop --colocate (engines and trainer on their own bundles) or use slime.train"
        )
    epochs_counted = args.num_rollout is None  # --num-epoch: preflight counts the rollouts
    preflight(args)
    num_rollout_per_epoch = _rollouts_per_epoch(args) if epochs_counted else None
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_args(args, args_path(args))
    print(f"[slime] run directory: {run_dir.resolve()}", flush=True)
    for note in [*startup_notes(args), custom_config_note(args)]:
        if note:
            print(f"[slime] {note}", flush=True)
    metrics_log = MetricsLogger.from_args(args, console=False)  # metrics.jsonl, TensorBoard, wandb

    global _ray_started_here
    _ray_started_here = init_ray(args) or _ray_started_here
    placement = create_placement(args)
    shm_before = shm_buffers()  # weight buffers under /dev/shm that are not this run's
    rollout_manager = actor_model = None
    try:
        rollout_manager = RolloutManager.options(num_cpus=0).remote(args, placement)
        actor_model = None if args.debug_rollout_only else RayTrainGroup(args, placement)  # rollout-only: no trainer
        rollout_ready = rollout_manager.init.remote()  # engines start while the trainer loads its model
        resumed_at = actor_model.init() if actor_model else 0  # the --load checkpoint's rollout + 1, else 0
        ray.get(rollout_ready)
        if resumed_at:
            print(
                f"[slime] resumed from {latest_dir(args.load)}: training continues at rollout {resumed_at}", flush=True
            )
        if args.start_rollout_id is None:  # slime's rule: unset, the loop starts where the checkpoint left off
            # written into args as slime does (slime/ray/placement_group.py create_training_models)
            args.start_rollout_id = resumed_at
        return _loop(args, rollout_manager, actor_model, metrics_log, max_lag, num_rollout_per_epoch)
    except KeyboardInterrupt:  # say where to pick up: the same command with --load
        note = latest_checkpoint_note(args.save) if args.save else "no --save: there is no checkpoint to resume from"
        print(f"[slime] interrupted; {note}", file=sys.stderr, flush=True)
        raise
    finally:
        metrics_log.close()
        _release(rollout_manager, actor_model, placement, shm_before)


def _release(rollout_manager, actor_model: RayTrainGroup | None, placement, shm_before: set[str]) -> None:
    """Stop engines and the router, kill this stage's actors and free its placement group: everything
    the stage created in a Ray session that may outlive it (the next stage's, a shared cluster)."""
    if rollout_manager is not None:
        try:
            ray.get(rollout_manager.dispose.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - cleanup: the manager may already be dead; its engines exit with their owner
            pass
    trainers = actor_model.actors if actor_model else []
    closing = []  # killed, a trainer would leave its /dev/shm weight buffer behind: every rank closes at once
    for actor in trainers:
        try:
            closing.append(actor.close_weight_sync.remote())
        except Exception:  # noqa: BLE001 - a trainer of another backend has no such call
            pass
    if closing:  # a dead or hung rank does not hold up the others; its buffer is stale, removed below
        ray.wait(closing, num_returns=len(closing), timeout=30)
    for actor in [*trainers, *filter(None, [rollout_manager])]:
        ray.kill(actor)
    remove_placement_group(placement.pg)
    # the run's buffers whose rank died without closing (killed, crashed, interrupted)
    remove_stale_buffers(shm_buffers() - shm_before, wait_s=10)


def _rollouts_per_epoch(args: Namespace) -> int | None:
    """slime's num_rollout_per_epoch when --num-epoch set --num-rollout: prompts per epoch //
    --rollout-batch-size (each epoch's end is then a save and eval point). Counted only when an
    interval will use it: a custom data source is loaded to be counted."""
    if args.save_interval is None and args.eval_interval is None:
        return None
    return count_prompts(args, None) // args.rollout_batch_size


def _loop(
    args: Namespace,
    rollout_manager,
    actor_model: RayTrainGroup | None,
    metrics_log: MetricsLogger,
    max_lag: int = 0,
    num_rollout_per_epoch: int | None = None,
) -> dict[str, float]:
    """Each step: take rollout k (asking for it now unless it was asked for ahead), ask for the
    rollouts up to k + max_lag, train on k, sync the weights when due (after the rollouts in
    flight finish: a weight update never lands inside a rollout), save and evaluate at slime's
    cadence (`should_run_periodic_action`). --num-rollout 0: one eval, no training (slime's)."""
    start_rollout_id = args.start_rollout_id
    # --debug-rollout-only starts no trainer, --debug-train-only no engines: nothing to sync either way
    trains, serves = actor_model is not None, not args.debug_train_only
    if trains and serves:
        # The engines start from the checkpoint on disk; push the trainer's (possibly resumed) weights.
        _sync_weights(args, rollout_manager, actor_model, str(start_rollout_id))

    parity_tokens = _parity_tokens(args) if args.check_weight_update_equal else []
    progress = StageProgress(args.stage or "train", total=args.num_rollout, initial=start_rollout_id)
    try:  # an error leaves no half-drawn progress bar under its message
        last = _eval_before_training(args, rollout_manager, metrics_log, progress) if serves else {}

        rollouts = Rollouts(rollout_manager, start_rollout_id, args.num_rollout)
        for rollout_id in range(start_rollout_id, args.num_rollout):
            metrics: dict[str, float] = {}
            save_now, eval_now = _periodic(args, rollout_id, num_rollout_per_epoch)
            save_now, eval_now = trains and save_now, serves and eval_now
            with timer("step", metrics):
                progress.phase("rollout")
                rollout_data_ref, rollout_metrics = rollouts.take(rollout_id)
                metrics.update(rollout_metrics)
                if not save_now:  # a checkpoint's data position is rollout k's: nothing is generated past it yet
                    rollouts.ask_through(rollout_id + max_lag)  # train_async: rollout k+1 generates while k trains

                if trains:
                    # the engine frees its KV cache while the trainer uses the cores (not while it generates ahead)
                    offload_rollout = args.offload_rollout and not rollouts.asked
                    if offload_rollout:
                        with timer("rollout_offload", metrics, accumulate=True):
                            ray.get(rollout_manager.offload.remote())
                    progress.phase("train")  # --offload-train: the trainer's optimizer state is back for the step only
                    with timer("train_wait", metrics):  # the trainer's train_time plus moving the data and the call
                        metrics.update(actor_model.train(rollout_id, rollout_data_ref))
                    if offload_rollout:
                        with timer("rollout_offload", metrics, accumulate=True):
                            ray.get(rollout_manager.onload.remote())

                if trains and serves and _sync_due(args, rollout_id, eval_now):
                    progress.phase("sync")
                    rollouts.wait_in_flight()  # slime: never update the weights in the middle of a generation
                    with timer("sync_wait", metrics):  # update_weights_time plus the engines' pause and resume
                        metrics.update(
                            _sync_weights(args, rollout_manager, actor_model, str(rollout_id + 1), parity_tokens)
                        )

                if save_now:
                    progress.phase("save")
                    # both sides write into a staging directory; then it is flushed, renamed into place,
                    # and only then the tracker names it: a kill at any moment leaves a complete checkpoint
                    ckpt = actor_model.save(rollout_id)
                    ray.get(rollout_manager.save.remote(rollout_id, ckpt))
                    commit_checkpoint(args.save, rollout_id)
                    report_run(args.run_dir)  # report.html as of this save (curves up to the last logged step)
                if eval_now:
                    progress.phase("eval")
                    metrics.update(ray.get(rollout_manager.eval.remote(rollout_id)))
                rollouts.ask_through(rollout_id + max_lag)  # after a checkpoint: the next rollouts start now

            # Logged after the step: step k's row describes rollout k and the weights it produced.
            metrics_log.log(rollout_id + 1, metrics)
            progress.step(metrics)
            last = metrics
    finally:
        progress.close()
    return last


def _periodic(args: Namespace, rollout_id: int, num_rollout_per_epoch: int | None) -> tuple[bool, bool]:
    """(save, evaluate) after rollout `rollout_id`, slime's rule: every --save-interval /
    --eval-interval rollouts and at each epoch's end (--num-epoch); the last rollout is saved too
    (with a --save-interval) but evaluated only when the interval or an epoch end says so."""
    save = should_run_periodic_action(rollout_id, args.save_interval, num_rollout_per_epoch, args.num_rollout)
    return save, should_run_periodic_action(rollout_id, args.eval_interval, num_rollout_per_epoch)


def _eval_before_training(args: Namespace, rollout_manager, metrics_log: MetricsLogger, progress) -> dict:
    """slime's eval of the policy before training (logged at step 0): with an --eval-interval, when
    the run starts at rollout 0 without --skip-eval-before-train, and always in an eval-only run
    (--num-rollout 0), where it is all the run does."""
    if args.eval_interval is None:
        return {}
    if args.num_rollout != 0 and (args.start_rollout_id != 0 or args.skip_eval_before_train):
        return {}
    progress.phase("eval")
    metrics = ray.get(rollout_manager.eval.remote(-1))  # -1: the eval before rollout 0 (sample log eval_-00001)
    metrics_log.log(0, metrics)
    progress.note(metrics)
    return metrics


class Rollouts:
    """The rollouts asked of the manager and not yet trained on, by rollout id: the loop's only
    state for generating ahead. The manager is one actor, so they generate in order."""

    def __init__(self, rollout_manager, first: int, num_rollout: int) -> None:
        self.manager, self.next, self.num_rollout = rollout_manager, first, num_rollout
        self.asked: dict[int, tuple] = {}  # rollout id -> (data ref, metrics ref)

    def ask_through(self, last: int) -> None:
        """Start generating every rollout up to `last` (within the run) not asked for yet."""
        while self.next <= min(last, self.num_rollout - 1):
            self.asked[self.next] = self.manager.generate.options(num_returns=2).remote(self.next)
            self.next += 1

    def take(self, rollout_id: int) -> tuple[object, dict[str, float]]:
        """Rollout `rollout_id`'s data ref and metrics, once it is generated; `perf/rollout_wait_time`
        is how long the loop waited for it (the rollout time not hidden behind training)."""
        self.ask_through(rollout_id)
        data_ref, metrics_ref = self.asked.pop(rollout_id)
        t0 = time.perf_counter()
        metrics = _get_rollout_metrics(metrics_ref, data_ref)
        metrics["perf/rollout_wait_time"] = time.perf_counter() - t0
        return data_ref, metrics

    def wait_in_flight(self) -> None:
        """Until every rollout asked for is generated (its errors surface when it is taken)."""
        refs = [metrics_ref for _, metrics_ref in self.asked.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs))


def _sync_due(args: Namespace, rollout_id: int, eval_now: bool) -> bool:
    """Every --update-weights-interval rollouts and after the last; SFT data never comes from the
    policy, so for SFT the engine needs new weights only to evaluate."""
    last = rollout_id == args.num_rollout - 1
    if args.loss_type == "sft_loss":
        return eval_now or last
    return last or (rollout_id + 1) % args.update_weights_interval == 0


def _sync_weights(
    args: Namespace, rollout_manager, actor_model: RayTrainGroup, version: str, parity_tokens: list[int] | None = None
) -> dict[str, float]:
    """The trainer's weights into every live engine (one that died was removed from the router by
    the engine watcher); --check-weight-update-equal and --ci-test check that they arrived."""
    # --use-fault-tolerance: dead/hung engines are restarted first (a restarted one needs a new
    # weight-update group); a rollout that generates across rollouts (fully async) finishes or aborts
    # its requests (before_weight_update)
    restarted, engine_urls, metrics = ray.get(rollout_manager.prepare_weight_update.remote())
    if restarted:
        actor_model.reset_weight_sync()
    actor_model.connect_rollout(engine_urls)
    try:
        metrics.update(actor_model.update_weights(weight_version=version))  # perf/update_weights_time, ...
    finally:
        ray.get(rollout_manager.after_weight_update.remote())
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
        except Exception:  # noqa: BLE001 - the same error as the one re-raised below
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
    report_run(run_dir)  # report.html: curves, rollout browser, run facts (`slime report RUN_DIR`)
    if args.use_tensorboard:
        print(f"[slime] tensorboard --logdir {tensorboard_dir(args).resolve()}")


def shutdown() -> None:
    """Stop the Ray session a run in this process started; one that was up before stays up."""
    global _ray_started_here
    if _ray_started_here and ray.is_initialized():
        ray.shutdown()
    _ray_started_here = False


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


def main(argv: Sequence[str] | None = None, max_lag: int = 0, command: str = "slime train") -> int:
    def body() -> None:
        args = parse_args(argv, prog=command)
        train(args, max_lag=max_lag)
        finish_run(args)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
