"""Debugging and CI checks: slime's `add_debug_arguments`, `add_ci_arguments`, its pre-parsed
`--debug-rollout-only` / `--debug-train-only` / `--load-debug-rollout-data`, and
`--get-mismatch-metrics`; names, dests, defaults and meanings are slime's.

* `--debug-rollout-only`: engines and rollouts only, no trainer (nothing trained, synced or saved;
  colocation off, as slime).
* `--debug-train-only`: the trainer only, no engines (no weight sync, no evaluation). With the
  default rollout function it needs `--load-debug-rollout-data`.
* `--save-debug-rollout-data PATTERN` / `--load-debug-rollout-data PATTERN` (implies
  `--debug-train-only`, as slime) / `--load-debug-rollout-data-subsample RATIO`,
  `--save-debug-train-data PATTERN`, `--dump-details DIR` (both saves under DIR, with readable
  `.jsonl` records): slime.observability.debug_data.
* `--ci-test`, `--ci-disable-kl-checker`, `--ci-train-rollout-logprob-abs-diff-threshold`,
  `--ci-save-grad-norm`, `--ci-load-grad-norm`: slime.observability.ci_checks.
* `--get-mismatch-metrics`: `train/mis_*` (slime.algorithms.mismatch) every step, from the
  trainer's and the engine's log-probs of the sampled tokens; the loss is unchanged. slime computes
  them through a `--custom-tis-function-path` it requires (its example's `mis.py`); here they are
  built in, so none is needed. With `--use-rollout-logprobs` the trainer's log-probs take one more
  forward pass, as slime says.
"""

from __future__ import annotations

import argparse

from slime.arguments.checks import need
from slime.arguments.rollout import DEFAULT_ROLLOUT_FUNCTION


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("debugging and CI checks")
    _add_debug_run_arguments(g)
    _add_debug_data_arguments(g)
    _add_ci_arguments(g)


def _add_debug_run_arguments(g: argparse._ArgumentGroup) -> None:
    """Half a run: the engines and rollouts only, or the trainer only."""
    g.add_argument(
        "--debug-rollout-only",
        action="store_true",
        default=False,
        help="Run the engines and rollouts only: no trainer, nothing trained or synced.",
    )
    g.add_argument(
        "--debug-train-only",
        action="store_true",
        default=False,
        help="Run the trainer only: no engines (use with --load-debug-rollout-data).",
    )


def _add_debug_data_arguments(g: argparse._ArgumentGroup) -> None:
    """Rollout and train data saved for debugging, and loaded back in place of a rollout."""
    g.add_argument(
        "--save-debug-rollout-data",
        type=str,
        default=None,
        help="Save each rollout's samples to this path for debugging: "
        "save_debug_rollout_data.format(rollout_id=...) (torch.save).",
    )
    g.add_argument(
        "--load-debug-rollout-data",
        type=str,
        default=None,
        help="Train on rollout data saved by --save-debug-rollout-data (path with {rollout_id}) "
        "instead of generating; implies --debug-train-only.",
    )
    g.add_argument(
        "--load-forge-rollout-data",
        type=str,
        default=None,
        help="A saved rollout (a file, or a path with {rollout_id}) that "
        "slime.rollout.forge_load.generate_rollout replays while the engines stay up "
        "(unlike --load-debug-rollout-data, no --debug-train-only).",
    )
    g.add_argument(
        "--load-debug-rollout-data-subsample",
        type=float,
        default=None,
        help="Subsample a portion of the debug rollout data for faster debugging.",
    )
    g.add_argument(
        "--save-debug-train-data",
        type=str,
        default=None,
        help="Save one train-side file per rollout with every rank's samples (path may hold "
        "{rollout_id} and the writer's {rank}).",
    )
    g.add_argument(
        "--dump-details",
        type=str,
        default=None,
        help="Dump all details of training (rollout and train data, with readable .jsonl "
        "records) under this directory for post-hoc analysis.",
    )


def _add_ci_arguments(g: argparse._ArgumentGroup) -> None:
    """slime's CI checks, and the train/rollout mismatch metrics."""
    g.add_argument(
        "--ci-test",
        action="store_true",
        help="Check the run as slime's CI does; a failed check stops it with a report.",
    )
    g.add_argument(
        "--ci-disable-kl-checker",
        action="store_true",
        help="With --ci-test: skip the first-step ppo_kl / kl_loss checks.",
    )
    g.add_argument(
        "--ci-train-rollout-logprob-abs-diff-threshold",
        type=float,
        default=0.1,
        help="Upper bound asserted on train/train_rollout_logprob_abs_diff when --ci-test is set.",
    )
    g.add_argument(
        "--ci-save-grad-norm",
        type=str,
        default=None,
        help="Save each step's grad norm to this path ({role}, {rollout_id}, {step_id}).",
    )
    g.add_argument(
        "--ci-load-grad-norm",
        type=str,
        default=None,
        help="Compare each step's grad norm with the one saved by --ci-save-grad-norm.",
    )
    g.add_argument(
        "--get-mismatch-metrics",
        action="store_true",
        default=False,
        help="Log the train/rollout mismatch metrics (train/mis_*) every step.",
    )


def _pattern(option: str, value: str | None, **fields: object) -> None:
    """A path pattern formats with the fields it is given (a typo in a placeholder stops here)."""
    if value is None:
        return
    try:
        value.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        need(
            False,
            f"{option} {value!r}: placeholders may be {', '.join('{' + f + '}' for f in fields)} "
            f"only ({type(e).__name__}: {e})",
        )


def finalize(args: argparse.Namespace) -> None:
    if args.dump_details is not None:  # slime's layout under the directory
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.pt"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.pt"
    need(
        args.save_debug_train_data is None or args.save_debug_train_data != args.save_debug_rollout_data,
        "--save-debug-train-data must not be equal to --save-debug-rollout-data",
    )
    _pattern("--save-debug-rollout-data", args.save_debug_rollout_data, rollout_id=0)
    _pattern("--load-debug-rollout-data", args.load_debug_rollout_data, rollout_id=0)
    _pattern("--save-debug-train-data", args.save_debug_train_data, rollout_id=0, rank=0)
    _pattern("--ci-save-grad-norm", args.ci_save_grad_norm, role="actor", rollout_id=0, step_id=0)
    _pattern("--ci-load-grad-norm", args.ci_load_grad_norm, role="actor", rollout_id=0, step_id=0)
    need(
        not (args.ci_save_grad_norm and args.ci_load_grad_norm),
        "--ci-save-grad-norm and --ci-load-grad-norm: give one (save on a reference run, load on the run checked)",
    )
    need(
        args.ci_train_rollout_logprob_abs_diff_threshold >= 0,
        f"--ci-train-rollout-logprob-abs-diff-threshold must be >= 0, got "
        f"{args.ci_train_rollout_logprob_abs_diff_threshold}",
    )

    ratio = args.load_debug_rollout_data_subsample
    if ratio is not None:
        need(
            args.load_debug_rollout_data is not None,
            "--load-debug-rollout-data-subsample subsamples --load-debug-rollout-data: give that too",
        )
        need(0 < ratio <= 1, f"--load-debug-rollout-data-subsample must be in (0, 1], got {ratio}")
    if args.load_debug_rollout_data is not None:
        need(
            not args.debug_rollout_only,
            "--load-debug-rollout-data trains on saved rollouts (it implies --debug-train-only); "
            "--debug-rollout-only starts no trainer: use one",
        )
        args.debug_train_only = True  # slime: no engines, only the training process
    need(
        not (args.debug_rollout_only and args.debug_train_only),
        "--debug-rollout-only and --debug-train-only cannot be set at the same time, please set only one of them",
    )

    if args.debug_rollout_only:
        for option, on in (
            ("--check-weight-update-equal", args.check_weight_update_equal),
            ("--save-debug-train-data", args.save_debug_train_data and args.dump_details is None),
            ("--get-mismatch-metrics", args.get_mismatch_metrics),
            ("--ci-save-grad-norm", args.ci_save_grad_norm),
            ("--ci-load-grad-norm", args.ci_load_grad_norm),
        ):
            need(not on, f"{option} acts in the trainer, which --debug-rollout-only does not start")
        args.colocate = False  # slime: nothing to take turns with
    if args.debug_train_only:
        need(
            not args.check_weight_update_equal,
            "--check-weight-update-equal compares the engines with the trainer; --debug-train-only starts no engines",
        )
        need(
            args.load_debug_rollout_data is not None or args.rollout_function_path != DEFAULT_ROLLOUT_FUNCTION,
            f"--debug-train-only starts no engines, and --rollout-function-path {args.rollout_function_path} "
            f"generates with them: give --load-debug-rollout-data (rollouts saved by --save-debug-rollout-data) "
            f"or a rollout function that needs no engine",
        )
    if args.get_mismatch_metrics:
        need(
            not args.rollout_function_path.endswith("sft_rollout.generate_rollout"),
            f"--get-mismatch-metrics compares with the engine's log-probs, which --rollout-function-path "
            f"{args.rollout_function_path} (SFT data) does not produce",
        )
        need(
            args.loss_type == "policy_loss",
            f"--get-mismatch-metrics is logged by --loss-type policy_loss, not {args.loss_type}",
        )


def unused_note(args: argparse.Namespace) -> str | None:
    """What the debug modes leave out, said once at start-up."""
    if args.debug_train_only and (args.eval_prompt_data or args.eval_config):
        return "--debug-train-only: no engines, so no evaluation (--eval-prompt-data / --eval-config not used)"
    return None
