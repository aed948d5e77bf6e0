"""What a run leaves behind: its run directory, metrics (metrics.jsonl, TensorBoard, Weights & Biases)
and the weight-sync check.

The wandb and TensorBoard options are slime's (`add_wandb_arguments` / `add_tensorboard_arguments`
of slime/utils/arguments.py): same names, dests and defaults. Every metrics row goes to all sinks
from one place (slime.observability.metrics.MetricsLogger), so the wandb run and TensorBoard hold
the keys and global step of metrics.jsonl. What each option does here:

* `--use-wandb` logs to a wandb run, started in the trainer's driver (one run per run directory:
  a later stage of the same --run-dir resumes it). `--wandb-project/-team/-group/-host/-key/-dir`
  are wandb's project, entity, group, base URL, API key and directory (default: WANDB_DIR, else
  the run directory). Run naming as slime's: with the random suffix (default) the group is
  `<group>_<id>` and the run `<group>_<id>-RANK_0`; `--disable-wandb-random-suffix` uses the group as
  both. Without `--wandb-group` the run directory's name is the group.
* `--wandb-mode`: as given. Not given: WANDB_MODE; else online when an API key is known
  (`--wandb-key`, WANDB_API_KEY, `wandb login`) and the host answers within 2 s, otherwise offline,
  said in one line. `--wandb-mode online` that cannot work (no key, host unreachable) stops before
  the run starts instead of losing its logs (slime.observability.wandb_sink).
* `--wandb-run-id`: resume (or create) the wandb run with that id; afterwards `args.wandb_run_id`
  is the run's id, as under slime.
* `--tb-project-name` / `--tb-experiment-name`: with `--use-tensorboard`, events go to
  `tensorboard_log/<project>/<experiment>` (experiment default: a timestamp) or to
  $TENSORBOARD_DIR, as slime's; without either, to `<run-dir>/tensorboard`.
* slime's extra rollout statistics, added to the rollout's metrics row with slime's keys
  (slime.rollout.train_data): `--log-passrate` (`passrate/pass@k` over each prompt's
  `--n-samples-per-prompt` samples, a sample correct when its raw reward is 1, and
  `eval/<name>-pass@k`), `--log-reward-category KEY` (`rollout/error_cat/<value>`: the fraction of
  samples whose reward dict holds that value under KEY; `eval/<name>/error_cat/<value>` too),
  `--log-multi-turn` (`multi_turn/raw_response_length/...`, `multi_turn/wo_obs_response_length/...`
  and, when samples carry `metadata["round_number"]`, `multi_turn/multi_turn_metric/round_number_*`),
  `--log-correct-samples` (`rollout/correct_length/p25..p100`, `rollout/correct_entropy`).
* `--use-pytorch-profiler` with `--profile-step-start/--profile-step-end` (Megatron's) and `--profile-target`
  (slime's): torch profiler traces of the training ranks in `--tensorboard-dir` (default
  `<run-dir>/tensorboard`), slime's `TrainProfiler` (slime.observability.profile_utils).
* `--record-memory-history` with slime's `--memory-recorder memray`: a memray capture of each
  training rank (slime.backends.torch.memory_recorder); `--memory-recorder torch` (CUDA snapshots)
  is named in the start-up line below.
* Not used here, named in one start-up line when set (`unused_note`): `--wandb-always-use-train-step`
  (every sink's step is the global rollout step of metrics.jsonl).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

from slime.errors import SlimeError

TB_EXPERIMENT_TIME_FORMAT = "%Y%m%d_%H%M%S"  # slime's default --tb-experiment-name
PROFILE_TARGETS = ("train_overall", "train_actor", "train_log_probs")  # slime's --profile-target choices

# Options of slime's add_wandb_arguments that have no effect on this backend, and why.
NOT_USED = {
    "wandb_always_use_train_step": (
        "--wandb-always-use-train-step",
        "every sink (metrics.jsonl, TensorBoard, wandb) uses the global rollout step",
    ),
}
WANDB_DESTS = (
    "wandb_project",
    "wandb_team",
    "wandb_group",
    "wandb_host",
    "wandb_key",
    "wandb_mode",
    "wandb_dir",
    "wandb_run_id",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging")
    g.add_argument(
        "--run-dir",
        type=str,
        default=None,
        help="Where the run writes its metrics, arguments, samples and report. Default: runs/<timestamp>. "
        "One run per directory: a directory holding an earlier run is refused unless --load resumes it "
        "or --overwrite-run-dir is given.",
    )
    g.add_argument(
        "--overwrite-run-dir",
        action="store_true",
        help="Start over in a --run-dir that holds an earlier run: that directory is moved aside to "
        "<run-dir>.replaced-<time> (nothing is deleted) and the run starts in a fresh one.",
    )
    g.add_argument(
        "--check-weight-update-equal",
        action="store_true",
        help="After each weight sync, compare engine and trainer log-probs on a fixed sequence.",
    )
    g.add_argument("--stage", type=str, default=None, help="Stage name written with every metrics row.")
    # slime-rl's own (slime has no run report): the sample log `slime report` browses
    g.add_argument(
        "--report-groups-per-rollout",
        type=int,
        default=4,
        help="slime-rl: how many groups of each rollout (the first ones, every sample of each, "
        "FAILED ones included) and of each eval data set are written to <run-dir>/samples/ "
        "for the run report's rollout browser (`slime report RUN_DIR`; the report is also "
        "written at each --save-interval and at the end). 0: no sample log.",
    )

    _add_tensorboard_arguments(g)
    _add_wandb_arguments(g)
    _add_profiling_arguments(p)
    _add_memory_recorder_arguments(p)


def _add_tensorboard_arguments(g: argparse._ArgumentGroup) -> None:
    """slime's add_tensorboard_arguments: the metrics as TensorBoard scalars."""
    g.add_argument(
        "--use-tensorboard",
        action="store_true",
        default=False,
        help="Also write the metrics as TensorBoard scalars (default dir: <run-dir>/tensorboard).",
    )
    g.add_argument(
        "--tb-project-name",
        type=str,
        default=None,
        help="TensorBoard logs go to tensorboard_log/<project>/<experiment> ($TENSORBOARD_DIR wins).",
    )
    g.add_argument(
        "--tb-experiment-name",
        type=str,
        default=None,
        help="With --tb-project-name; default: the start time (YYYYmmdd_HHMMSS).",
    )


def _add_wandb_arguments(g: argparse._ArgumentGroup) -> None:
    """slime's add_wandb_arguments: Weights & Biases, and the extra rollout statistics logged with it."""
    g.add_argument(
        "--use-wandb", action="store_true", default=False, help="Also log the metrics to a Weights & Biases run."
    )
    g.add_argument(
        "--wandb-mode",
        type=str,
        default=None,
        choices=["online", "offline", "disabled"],
        help="Default: $WANDB_MODE, else online when an API key is known and the host answers, "
        "else offline (said at start-up). 'online' that cannot work stops the run.",
    )
    g.add_argument(
        "--wandb-dir",
        type=str,
        default=None,
        help="Directory for wandb's files (it writes <dir>/wandb/...). Default: $WANDB_DIR, else the run directory.",
    )
    g.add_argument("--wandb-key", type=str, default=None, help="wandb API key (default: WANDB_API_KEY / wandb login).")
    g.add_argument("--wandb-host", type=str, default=None, help="wandb server URL (default: WANDB_BASE_URL / wandb's).")
    g.add_argument("--wandb-team", type=str, default=None, help="wandb entity.")
    g.add_argument("--wandb-group", type=str, default=None, help="wandb group (default: the run directory's name).")
    g.add_argument("--wandb-project", type=str, default=None, help="wandb project.")
    g.add_argument(
        "--disable-wandb-random-suffix",
        action="store_false",
        dest="wandb_random_suffix",
        default=True,
        help="Name the group and run exactly --wandb-group (default: add a random suffix, as slime).",
    )
    g.add_argument(
        "--wandb-always-use-train-step",
        action="store_true",
        default=False,
        help="Accepted for slime scripts; not used (every sink uses the global rollout step).",
    )
    g.add_argument(
        "--log-multi-turn",
        action="store_true",
        default=False,
        help="Log multi_turn/* response-length (with and without observation tokens) and round statistics.",
    )
    g.add_argument(
        "--log-passrate",
        action="store_true",
        default=False,
        help="Log passrate/pass@k of the rollout (and eval/<name>-pass@k); correct = raw reward 1.",
    )
    g.add_argument(
        "--log-reward-category",
        type=str,
        default=None,
        help="Key of the reward dict holding a category (e.g. why a reward failed); logs "
        "rollout/error_cat/<category> as a fraction of the samples.",
    )
    g.add_argument(
        "--log-correct-samples",
        action="store_true",
        default=False,
        help="Log rollout/correct_length/p25..p100 and rollout/correct_entropy of the samples whose raw reward is 1.",
    )
    g.add_argument(
        "--wandb-run-id",
        type=str,
        default=None,
        help="Resume (or create) the wandb run with this id; set to the run's id once it starts.",
    )


def _add_profiling_arguments(p: argparse.ArgumentParser) -> None:
    """torch profiler of the training ranks: Megatron-LM's options (defaults included) as slime uses
    them, and slime's --profile-target (slime.observability.profile_utils)."""
    g = p.add_argument_group("profiling")
    g.add_argument(
        "--use-pytorch-profiler",
        action="store_true",
        default=False,
        help="Record a torch profiler trace of each training rank (Chrome trace JSON, gzipped: "
        "<--tensorboard-dir>/<target>_rank_<r>[_step_<s>].<time_ns>.pt.trace.json.gz; opens in "
        "Perfetto, "
        "chrome://tracing or TensorBoard's profiler plugin).",
    )
    g.add_argument(
        "--profile-step-start",
        type=int,
        default=10,
        help="First training step (train call of this run, counted from 0) the trace records.",
    )
    g.add_argument(
        "--profile-step-end", type=int, default=12, help="The trace records the training steps before this one."
    )
    g.add_argument(
        "--profile-target",
        type=str,
        nargs="+",
        choices=PROFILE_TARGETS,
        default=["train_overall"],
        help="What is traced: train_overall (the rank's whole process over the steps, one trace), "
        "train_actor (the optimizer steps of each traced step, one trace per step), "
        "train_log_probs (the old/reference log-prob passes of each traced step).",
    )
    g.add_argument(
        "--tensorboard-dir",
        type=str,
        default=None,
        help="Where --use-pytorch-profiler writes its traces (Megatron's option; default: "
        "<run-dir>/tensorboard). The metrics' TensorBoard events follow --use-tensorboard.",
    )


def _add_memory_recorder_arguments(p: argparse.ArgumentParser) -> None:
    """slime's memory recorder of the training ranks (slime.backends.torch.memory_recorder): Megatron's
    --record-memory-history / --memory-snapshot-path and slime's --memory-* options, their defaults."""
    g = p.add_argument_group("memory recorder")
    g.add_argument(
        "--record-memory-history",
        action="store_true",
        default=False,
        help="Record each training rank's memory allocations (with --profile-target train_overall), "
        "by --memory-recorder.",
    )
    g.add_argument(
        "--memory-recorder",
        type=str,
        choices=["torch", "memray"],
        default="torch",
        help="memray: host memory (the memray package), from the rank's start until "
        "--memory-snapshot-num-steps training steps; torch: CUDA memory snapshots (GPU-only, not used here).",
    )
    g.add_argument(
        "--memory-snapshot-dir",
        type=str,
        default=".",
        help="Where recordings go: memory_snapshot_time<t>_rank<r>_<--memory-snapshot-path>.",
    )
    g.add_argument(
        "--memory-snapshot-num-steps",
        type=int,
        default=None,
        help="The recording stops after this many training steps (required by --memory-recorder memray).",
    )
    g.add_argument(
        "--memory-snapshot-path",
        type=str,
        default="snapshot.pickle",
        help="The tail of each recording's file name.",
    )


def _finalize_memory_recorder(args: argparse.Namespace) -> None:
    if not (args.record_memory_history and args.memory_recorder == "memray"):
        return
    steps = args.memory_snapshot_num_steps
    if steps is None or steps < 1:
        raise SlimeError(f"--memory-recorder memray needs --memory-snapshot-num-steps >= 1, got {steps}")
    if importlib.util.find_spec("memray") is None:
        raise SlimeError("--memory-recorder memray needs the memray package: pip install memray")
    args.memory_snapshot_dir = os.path.abspath(args.memory_snapshot_dir)  # the training ranks write it


def finalize(args: argparse.Namespace) -> None:
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    if args.report_groups_per_rollout < 0:
        raise SlimeError(
            f"--report-groups-per-rollout must be >= 0 (0: no sample log), got {args.report_groups_per_rollout}"
        )
    # slime's default experiment name, fixed here so args.json records where TensorBoard writes
    if args.use_tensorboard and args.tb_project_name is not None and args.tb_experiment_name is None:
        args.tb_experiment_name = time.strftime(TB_EXPERIMENT_TIME_FORMAT)
    if args.use_pytorch_profiler:
        _finalize_profiler(args)
    _finalize_memory_recorder(args)


def _finalize_profiler(args: argparse.Namespace) -> None:
    start, end = args.profile_step_start, args.profile_step_end
    if start < 0:
        raise SlimeError(f"--profile-step-start must be >= 0, got {start}")
    if end <= start:
        raise SlimeError(
            f"--profile-step-end ({end}) must be greater than --profile-step-start ({start}): "
            "the trace records the steps from start up to end"
        )
    if "train_overall" in args.profile_target and len(set(args.profile_target)) > 1:
        # torch runs one profiler at a time in a process; train_overall's already covers both phases
        raise SlimeError(
            f"--profile-target {' '.join(args.profile_target)}: train_overall traces the whole step, "
            "train_actor and train_log_probs included; give it alone, or the phases without it"
        )
    if args.tensorboard_dir is None:  # absolute: the training ranks write it
        args.tensorboard_dir = os.path.abspath(os.path.join(args.run_dir, "tensorboard"))


def unused_note(args: argparse.Namespace) -> str | None:
    """One line naming the logging options set that do nothing on this run, or None."""
    parts = [f"{opt} ({why})" for dest, (opt, why) in NOT_USED.items() if getattr(args, dest)]
    if args.record_memory_history and args.memory_recorder == "torch":
        parts.append("--record-memory-history with --memory-recorder torch (CUDA memory snapshots are GPU-only)")
    if not args.use_wandb:
        given = [f"--{d.replace('_', '-')}" for d in WANDB_DESTS if getattr(args, d) is not None]
        if not args.wandb_random_suffix:
            given.append("--disable-wandb-random-suffix")
        if given:
            parts.append(f"{' '.join(given)} (without --use-wandb)")
    if not args.use_tensorboard:
        given = [f"--{d.replace('_', '-')}" for d in ("tb_project_name", "tb_experiment_name") if getattr(args, d)]
        if given:
            parts.append(f"{' '.join(given)} (without --use-tensorboard)")
    if not parts:
        return None
    return "logging options accepted but not used: " + "; ".join(parts)
