"""Training: checkpoints, slime's batching (rollout -> global batch -> micro-batches), optimizer
and learning-rate schedule, which parameters train, the training actors' environment."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from slime.arguments.checks import need, require_positive
from slime.errors import SlimeError

LR_DECAY_STYLES = ("constant", "linear", "cosine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints")
    g.add_argument("--hf-checkpoint", type=str, default=None, help="Local Hugging Face model directory.")
    g.add_argument("--ref-load", type=str, default=None, help="Reference model (default: --hf-checkpoint).")
    g.add_argument("--load", type=str, default=None, help="Resume from the latest checkpoint in this directory.")
    g.add_argument("--save", type=str, default=None, help="Checkpoint directory (default: <run-dir>/checkpoints).")
    g.add_argument("--save-interval", type=int, default=None)
    # Megatron-LM's option too (megatron_lm.json, default None); this definition wins, with slime's default.
    g.add_argument("--no-save-optim", action="store_true", default=False,
                   help="Checkpoints without optimizer state; --load of one starts a fresh optimizer.")

    g = p.add_argument_group("batching")
    g.add_argument("--global-batch-size", type=int, default=None, help="Samples per optimizer step.")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--num-steps-per-rollout", type=int, default=None)
    g.add_argument("--use-dynamic-batch-size", action="store_true",
                   help="Micro-batches packed (no padding) up to --max-tokens-per-gpu tokens; ignores --micro-batch-size.")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None)
    g.add_argument("--balance-data", action="store_true",
                   help="Give each trainer rank an even share of the rollout's tokens (equal sample counts; the "
                        "responses of one prompt may land in different steps), as slime's.")
    g.add_argument("--log-probs-chunk-size", type=int, default=-1, help="Rows per fp32 log-softmax chunk (-1: all).")

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam",), default="adam")
    g.add_argument("--lr", type=float, default=1e-6)
    # Megatron-LM's defaults, which a slime script runs with: linear decay, weight decay 0.01, beta2 0.999
    g.add_argument("--lr-decay-style", choices=LR_DECAY_STYLES, default="linear")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None,
                   help="Default: all optimizer steps of the run (num_rollout x steps per rollout).")
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--reset-optimizer-states", action="store_true", default=False,
                   help="Zero Adam's step count and moments before each rollout's training (policy and critic).")
    g.add_argument("--only-train-params-name-list", type=str, nargs="*", default=None,
                   help="Regexes (re.search) of parameter names to train; all others are frozen. "
                        "Names are the Hugging Face model's (model.layers.0.mlp.up_proj.weight).")
    g.add_argument("--freeze-params-name-list", type=str, nargs="*", default=None,
                   help="Regexes (re.search) of parameter names to freeze; all others train.")

    g = p.add_argument_group("training actors")
    g.add_argument("--train-env-vars", type=_json_object, default="{}",
                   help='JSON object of environment variables for the training actors, e.g. \'{"NCCL_DEBUG": "INFO"}\'.')


def _json_object(value: str) -> Any:
    """slime's ``type=json.loads``, with argparse's error naming the option on bad JSON."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected JSON, got {value!r} ({e})") from e


def finalize(args: argparse.Namespace) -> None:
    if args.ref_load is None:
        args.ref_load = args.hf_checkpoint
    if args.save is None:
        args.save = os.path.join(args.run_dir, "checkpoints")
    require_positive(args, "micro_batch_size")
    _finalize_batching(args)
    if args.use_dynamic_batch_size:
        need(args.max_tokens_per_gpu is not None and args.max_tokens_per_gpu >= 1,
             "--use-dynamic-batch-size needs --max-tokens-per-gpu (>= 1)")
        need(args.global_batch_size % args.actor_world_size == 0,
             f"--global-batch-size ({args.global_batch_size}) must be divisible by the data-parallel size "
             f"({args.actor_world_size}) with --use-dynamic-batch-size")
    else:
        need(args.max_tokens_per_gpu is None, "--max-tokens-per-gpu only applies with --use-dynamic-batch-size")
    need(args.log_probs_chunk_size == -1 or args.log_probs_chunk_size >= 1,
         f"--log-probs-chunk-size must be -1 (no chunking) or >= 1, got {args.log_probs_chunk_size}")
    need(args.lr_warmup_iters >= 0 and args.critic_lr_warmup_iters >= 0, "--lr-warmup-iters must be >= 0")
    need(0.0 <= args.min_lr <= args.lr, f"--min-lr ({args.min_lr}) must be in [0, --lr ({args.lr})]")
    if args.num_rollout is not None:  # else set when --num-epoch is counted (slime.arguments.set_num_rollout)
        finalize_schedule(args)
    _check_param_patterns(args)
    args.train_env_vars = _env_vars(args.train_env_vars)


def _check_param_patterns(args: argparse.Namespace) -> None:
    """Patterns compile and only one list is given (slime's rule); whether each matches a parameter is
    checked when the model is loaded."""
    need(not (args.only_train_params_name_list and args.freeze_params_name_list),
         "give only one of --only-train-params-name-list and --freeze-params-name-list")
    for option, patterns in (("--only-train-params-name-list", args.only_train_params_name_list),
                             ("--freeze-params-name-list", args.freeze_params_name_list)):
        for pat in patterns or ():
            try:
                re.compile(pat)
            except re.error as e:
                raise SlimeError(f"{option}: {pat!r} is not a valid regular expression ({e})") from e


def _env_vars(value: Any) -> dict[str, str]:
    """--train-env-vars as Ray's env_vars want it: string names, string values (numbers converted)."""
    need(isinstance(value, dict), f"--train-env-vars must be a JSON object of NAME: value, got {value!r}")
    out: dict[str, str] = {}
    for name, v in value.items():
        need(isinstance(v, (str, int, float)) and not isinstance(v, bool),
             f"--train-env-vars: {name} must be a string or number, got {v!r}")
        out[name] = str(v)
    return out


def _finalize_batching(args: argparse.Namespace) -> None:
    """slime's rule: rollout_batch_size x n_samples_per_prompt samples per rollout, global_batch_size
    samples per optimizer step, split evenly over data-parallel ranks."""
    samples_per_rollout = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None:
        if args.num_steps_per_rollout:
            if samples_per_rollout % args.num_steps_per_rollout:
                raise SlimeError(
                    f"--rollout-batch-size x --n-samples-per-prompt ({samples_per_rollout}) is not divisible by "
                    f"--num-steps-per-rollout ({args.num_steps_per_rollout})"
                )
            args.global_batch_size = samples_per_rollout // args.num_steps_per_rollout
        else:
            args.global_batch_size = samples_per_rollout
    if args.global_batch_size < 1:
        raise SlimeError(f"--global-batch-size must be >= 1, got {args.global_batch_size}")
    if samples_per_rollout % args.global_batch_size:
        raise SlimeError(
            f"--global-batch-size ({args.global_batch_size}) must divide --rollout-batch-size x "
            f"--n-samples-per-prompt ({args.rollout_batch_size} x {args.n_samples_per_prompt} = {samples_per_rollout})"
        )
    if not args.use_dynamic_batch_size and args.global_batch_size % (args.micro_batch_size * args.actor_world_size):
        raise SlimeError(
            f"--global-batch-size ({args.global_batch_size}) must be divisible by --micro-batch-size "
            f"({args.micro_batch_size}) x data-parallel size ({args.actor_world_size}, from --actor-num-nodes x "
            f"--actor-num-gpus-per-node)"
        )
    args.num_steps_per_rollout = samples_per_rollout // args.global_batch_size


def finalize_schedule(args: argparse.Namespace) -> None:
    """The LR schedule's length, once the run's number of rollouts is known."""
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.num_rollout * args.num_steps_per_rollout
    need(args.lr_decay_iters > args.lr_warmup_iters or args.lr_decay_style == "constant",
         f"--lr-decay-iters ({args.lr_decay_iters}) must exceed --lr-warmup-iters ({args.lr_warmup_iters})")
