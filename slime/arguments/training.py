"""Training: checkpoints and where a run starts, slime's batching (rollout -> global batch ->
micro-batches), optimizer and learning-rate schedule, which parameters train, the training actors'
environment, and slime's YAML of custom function arguments (`--custom-config-path`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch
import yaml

from slime.arguments.checks import need, require_positive
from slime.errors import SlimeError
from slime.utils.accelerator import check_bf16, cuda_available

LR_DECAY_STYLES = ("constant", "linear", "cosine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_checkpoint_arguments(p)
    _add_batching_arguments(p)
    _add_optimizer_arguments(p)
    g = p.add_argument_group("training actors")
    g.add_argument(
        "--train-env-vars",
        type=_json_object,
        default="{}",
        help='JSON object of environment variables for the training actors, e.g. \'{"NCCL_DEBUG": "INFO"}\'.',
    )

    g = p.add_argument_group("custom functions")
    g.add_argument(
        "--custom-config-path",
        type=str,
        default=None,
        help="YAML mapping whose every key becomes an attribute of args (slime's), for custom functions "
        "to read. A key that is already an attribute replaces its value, as under slime, after "
        "every other check (named at start-up; the value must keep the argument's type).",
    )
    # slime's Megatron plugin hooks; here called at the same points of the fsdp trainer (slime.backends.torch.hooks)
    g.add_argument(
        "--custom-megatron-before-log-prob-hook-path",
        type=str,
        default=None,
        help="fn(args, model, store_prefix), called before each log-prob pass of the trainer (old: '', "
        "reference: 'ref_', teacher: 'teacher_'); model is a one-element list holding the module.",
    )
    g.add_argument(
        "--custom-megatron-before-train-step-hook-path",
        type=str,
        default=None,
        help="fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler), called at the start "
        "of each optimizer step (gradients zeroed, before the forward); model is a one-element list.",
    )


def _add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Where the model comes from and where checkpoints go."""
    g = p.add_argument_group("checkpoints")
    g.add_argument("--hf-checkpoint", type=str, default=None, help="Local Hugging Face model directory.")
    g.add_argument("--ref-load", type=str, default=None, help="Reference model (default: --hf-checkpoint).")
    g.add_argument("--load", type=str, default=None, help="Resume from the latest checkpoint in this directory.")
    g.add_argument("--save", type=str, default=None, help="Checkpoint directory (default: <run-dir>/checkpoints).")
    g.add_argument(
        "--save-hf",
        type=str,
        default=None,
        help="With every checkpoint, also write the policy as a Hugging Face model directory (config, "
        "tokenizer, safetensors) at this path formatted with the rollout id, e.g. hf/iter_{rollout_id}.",
    )
    g.add_argument(
        "--save-interval",
        type=int,
        default=None,
        help="Save a checkpoint to --save every N rollouts, and after the last.",
    )
    # Megatron-LM's option too (megatron_lm.json, default None); this definition wins, with slime's default.
    g.add_argument(
        "--no-save-optim",
        action="store_true",
        default=False,
        help="Checkpoints without optimizer state; --load of one starts a fresh optimizer.",
    )
    g.add_argument(
        "--start-rollout-id",
        type=int,
        default=None,
        help="The first rollout id of the loop (slime's). Default: the --load checkpoint's rollout + 1, "
        "else 0. Resuming, the data position is the one saved with rollout id - 1; the LR "
        "schedule continues from the checkpoint's step count whatever this is (slime's).",
    )


def _add_batching_arguments(p: argparse.ArgumentParser) -> None:
    """Batches and micro-batches of a training step, and how often weights are synced."""
    g = p.add_argument_group("batching")
    g.add_argument("--global-batch-size", type=int, default=None, help="Samples per optimizer step.")
    g.add_argument(
        "--micro-batch-size",
        type=int,
        default=1,
        help="Samples per forward/backward pass; gradients accumulate over the global batch.",
    )
    g.add_argument(
        "--num-steps-per-rollout",
        type=int,
        default=None,
        help="Optimizer steps per rollout (sets --global-batch-size to the rollout's samples / N).",
    )
    g.add_argument(
        "--use-dynamic-batch-size",
        action="store_true",
        help="Micro-batches packed (no padding) up to --max-tokens-per-gpu tokens; ignores --micro-batch-size.",
    )
    g.add_argument(
        "--max-tokens-per-gpu",
        type=int,
        default=None,
        help="With --use-dynamic-batch-size: tokens per packed micro-batch on each trainer rank.",
    )
    g.add_argument(
        "--log-probs-max-tokens-per-gpu",
        type=int,
        default=None,
        help="With --use-dynamic-batch-size: tokens per packed micro-batch of the no-grad log-prob passes "
        "(old, reference, teacher); no backward there, so it may exceed --max-tokens-per-gpu (its default).",
    )
    g.add_argument(
        "--share-prompt-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Padded micro-batches: samples with the same prompt (the --n-samples-per-prompt of one group) "
        "run that prompt once and reuse its keys and values, gradients summed; the same numbers, "
        "fewer tokens to compute. Off with gradient checkpointing or sliding-window attention.",
    )
    g.add_argument(
        "--balance-data",
        action="store_true",
        help="Give each trainer rank an even share of the rollout's tokens (equal sample counts; the "
        "responses of one prompt may land in different steps), as slime's.",
    )
    g.add_argument("--log-probs-chunk-size", type=int, default=-1, help="Rows per fp32 log-softmax chunk (-1: all).")
    g.add_argument(
        "--update-weights-interval",
        type=int,
        default=1,
        help="Interval for updating the weights (slime's): the trainer's weights go to the engines "
        "after every this many rollouts (and after the last). slime's train_async reads it; here "
        "the synchronous loop honours it too (the two share one loop).",
    )


def _add_optimizer_arguments(p: argparse.ArgumentParser) -> None:
    """The optimizer, its schedule, the seed and determinism, and which parameters train."""
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam",), default="adam", help="adam (AdamW: decoupled --weight-decay).")
    g.add_argument("--lr", type=float, default=1e-6, help="Learning rate, reached after --lr-warmup-iters.")
    # Megatron-LM's defaults, which a slime script runs with: linear decay, weight decay 0.01, beta2 0.999
    g.add_argument(
        "--lr-decay-style",
        choices=LR_DECAY_STYLES,
        default="linear",
        help="Learning-rate schedule after warm-up, down to --min-lr.",
    )
    g.add_argument("--lr-warmup-iters", type=int, default=0, help="Optimizer steps of linear warm-up from 0 to --lr.")
    g.add_argument(
        "--lr-decay-iters",
        type=int,
        default=None,
        help="Default: all optimizer steps of the run (num_rollout x steps per rollout).",
    )
    g.add_argument("--min-lr", type=float, default=0.0, help="The learning rate the decay ends at.")
    g.add_argument("--weight-decay", type=float, default=0.01, help="Decoupled weight decay (AdamW).")
    g.add_argument("--adam-beta1", type=float, default=0.9, help="Adam's beta1 (first-moment decay).")
    g.add_argument("--adam-beta2", type=float, default=0.999, help="Adam's beta2 (second-moment decay).")
    g.add_argument("--adam-eps", type=float, default=1e-8, help="Adam's epsilon.")
    g.add_argument(
        "--clip-grad", type=float, default=1.0, help="Clip the global gradient norm to this (0: no clipping)."
    )
    g.add_argument(
        "--seed",
        type=int,
        default=1234,
        help="Seed of the trainer ranks (torch, + the rank) and of each engine's unseeded sampling "
        "(+ the engine's rank, unless --sglang-random-seed).",
    )
    # Megatron-LM's flag (slime: deterministic torch algorithms); here it makes the whole run reproducible
    g.add_argument(
        "--deterministic-mode",
        action="store_true",
        default=False,
        help="Reproducible runs: the same arguments and seeds write the same metrics.jsonl (timings "
        "aside). Trainers use deterministic torch algorithms; every sample is drawn with an engine "
        "sampling_seed (--rollout-seed + its index in the group, slime's rule); the rollout sends "
        "one request at a time, in prompt order, so the engines batch the same way in every run "
        "(slower rollouts; SGLang engines also get --enable-deterministic-inference). Timing-"
        "dependent features (--partial-rollout, the fully async rollout) are refused.",
    )
    g.add_argument(
        "--reset-optimizer-states",
        action="store_true",
        default=False,
        help="Zero Adam's step count and moments before each rollout's training (policy and critic).",
    )
    g.add_argument(
        "--use-stateless-adam",
        action="store_true",
        default=False,
        help="Adam that keeps no moments: every step is a first Adam step from zero moments "
        "(update lr * g / (|g| + eps), weight decay decoupled). Needs --no-save-optim.",
    )
    g.add_argument(
        "--only-train-params-name-list",
        type=str,
        nargs="*",
        default=None,
        help="Regexes (re.search) of parameter names to train; all others are frozen. "
        "Names are the Hugging Face model's (model.layers.0.mlp.up_proj.weight).",
    )
    g.add_argument(
        "--freeze-params-name-list",
        type=str,
        nargs="*",
        default=None,
        help="Regexes (re.search) of parameter names to freeze; all others train.",
    )


def _json_object(value: str) -> Any:
    """slime's ``type=json.loads``, with argparse's error naming the option on bad JSON."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected JSON, got {value!r} ({e})") from e


def finalize(args: argparse.Namespace) -> None:
    need(not (args.bf16 and args.fp16), "--bf16 and --fp16 are two mixed-precision choices; give one")
    if args.bf16:  # Megatron's option: bf16 autocast, fp32 master weights, on the device the trainer takes
        check_bf16(torch.device("cuda" if cuda_available() else "cpu"), "--bf16")
    if args.ref_load is None:
        args.ref_load = args.hf_checkpoint
    if args.save is None:
        args.save = os.path.join(args.run_dir, "checkpoints")
    if args.save_hf is not None:  # a bad pattern stops now, not at the first save
        try:
            args.save_hf.format(rollout_id=0)
        except (KeyError, IndexError, ValueError) as e:
            raise SlimeError(
                f"--save-hf {args.save_hf!r}: not a path pattern with {{rollout_id}} as its only field ({e!r})"
            ) from None
    require_positive(args, "micro_batch_size", "update_weights_interval")
    # Megatron's option, slime's default (10): how long a collective waits for a rank that died
    need(
        args.distributed_timeout_minutes > 0,
        f"--distributed-timeout-minutes must be > 0, got {args.distributed_timeout_minutes}",
    )
    _finalize_batching(args)
    if args.use_dynamic_batch_size:
        need(
            args.max_tokens_per_gpu is not None and args.max_tokens_per_gpu >= 1,
            "--use-dynamic-batch-size needs --max-tokens-per-gpu (>= 1)",
        )
        need(
            args.global_batch_size % args.data_parallel_size == 0,
            f"--global-batch-size ({args.global_batch_size}) must be divisible by the data-parallel size "
            f"({args.data_parallel_size}) with --use-dynamic-batch-size",
        )
        if args.log_probs_max_tokens_per_gpu is None:  # slime's default
            args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
        need(
            args.log_probs_max_tokens_per_gpu >= 1,
            f"--log-probs-max-tokens-per-gpu must be >= 1, got {args.log_probs_max_tokens_per_gpu}",
        )
    else:
        need(args.max_tokens_per_gpu is None, "--max-tokens-per-gpu only applies with --use-dynamic-batch-size")
        need(
            args.log_probs_max_tokens_per_gpu is None,
            "--log-probs-max-tokens-per-gpu only applies with --use-dynamic-batch-size",
        )
    need(
        args.log_probs_chunk_size == -1 or args.log_probs_chunk_size >= 1,
        f"--log-probs-chunk-size must be -1 (no chunking) or >= 1, got {args.log_probs_chunk_size}",
    )
    need(args.lr_warmup_iters >= 0 and args.critic_lr_warmup_iters >= 0, "--lr-warmup-iters must be >= 0")
    for opt in ("lr", "critic_lr"):
        value = getattr(args, opt, None)
        need(
            value is None or (math.isfinite(value) and value >= 0),
            f"--{opt.replace('_', '-')} must be a finite number >= 0, got {value}",
        )
    need(0.0 <= args.min_lr <= args.lr, f"--min-lr ({args.min_lr}) must be in [0, --lr ({args.lr})]")
    # slime's rule: there are no moments to save, so a checkpoint must not claim an optimizer state
    need(
        not args.use_stateless_adam or args.no_save_optim,
        "--use-stateless-adam keeps no Adam moments to save; add --no-save-optim",
    )
    if args.num_rollout is not None:  # else set when --num-epoch is counted (slime.arguments.set_num_rollout)
        finalize_schedule(args)
    _check_param_patterns(args)
    args.train_env_vars = _env_vars(args.train_env_vars)
    need(
        args.start_rollout_id is None or args.start_rollout_id >= 0,
        f"--start-rollout-id must be >= 0, got {args.start_rollout_id}",
    )
    _finalize_determinism(args)
    apply_custom_config(args)


FULLY_ASYNC_ROLLOUT = "slime.rollout.fully_async_rollout."
DETERMINISTIC_INFERENCE = "--enable-deterministic-inference"  # SGLang's batch-invariant kernels


def _finalize_determinism(args: argparse.Namespace) -> None:
    """--deterministic-mode refuses what depends on timing; `args.sglang_enable_deterministic_inference`
    (slime's attribute: give every sample a sampling_seed) is set by it or by
    --sglang-enable-deterministic-inference, as under slime."""
    tokens = list(args.sglang_args) if hasattr(args, "sglang_args") else []
    not_used = args.sglang_options_not_used if hasattr(args, "sglang_options_not_used") else []
    if args.deterministic_mode:
        need(
            not args.partial_rollout,
            "--deterministic-mode cannot run with --partial-rollout: the responses it keeps are whatever the "
            "aborted requests had generated when the batch filled, which depends on timing",
        )
        need(
            not args.rollout_function_path.startswith(FULLY_ASYNC_ROLLOUT),
            f"--deterministic-mode cannot run with --rollout-function-path {args.rollout_function_path}: the fully "
            "async rollout generates while the trainer trains, so which weights generate a sample depends on timing",
        )
        if args.rollout_backend == "sglang" and DETERMINISTIC_INFERENCE not in tokens:
            args.sglang_args = tokens + [DETERMINISTIC_INFERENCE]
    args.sglang_enable_deterministic_inference = bool(
        args.deterministic_mode
        or DETERMINISTIC_INFERENCE in tokens
        or "--sglang-enable-deterministic-inference" in not_used
    )


def _check_param_patterns(args: argparse.Namespace) -> None:
    """Patterns compile and only one list is given (slime's rule); whether each matches a parameter is
    checked when the model is loaded."""
    need(
        not (args.only_train_params_name_list and args.freeze_params_name_list),
        "give only one of --only-train-params-name-list and --freeze-params-name-list",
    )
    for option, patterns in (
        ("--only-train-params-name-list", args.only_train_params_name_list),
        ("--freeze-params-name-list", args.freeze_params_name_list),
    ):
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
        need(
            isinstance(v, (str, int, float)) and not isinstance(v, bool),
            f"--train-env-vars: {name} must be a string or number, got {v!r}",
        )
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
    if not args.use_dynamic_batch_size and args.global_batch_size % (args.micro_batch_size * args.data_parallel_size):
        raise SlimeError(
            f"--global-batch-size ({args.global_batch_size}) must be divisible by --micro-batch-size "
            f"({args.micro_batch_size}) x data-parallel size ({args.data_parallel_size}: --actor-num-nodes x "
            f"--actor-num-gpus-per-node / --tensor-model-parallel-size with the megatron backend)"
        )
    args.num_steps_per_rollout = samples_per_rollout // args.global_batch_size


def finalize_schedule(args: argparse.Namespace) -> None:
    """The LR schedule's length, once the run's number of rollouts is known."""
    need(
        args.start_rollout_id is None or args.start_rollout_id < args.num_rollout,
        f"--start-rollout-id {args.start_rollout_id} leaves nothing to train: --num-rollout is {args.num_rollout}",
    )
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.num_rollout * args.num_steps_per_rollout
    if args.num_rollout == 0:  # eval only (slime's): no step is ever taken, any schedule is a valid one
        args.lr_decay_iters = max(args.lr_decay_iters, args.lr_warmup_iters + 1)
    need(
        args.lr_decay_iters > args.lr_warmup_iters or args.lr_decay_style == "constant",
        f"--lr-decay-iters ({args.lr_decay_iters}) must exceed --lr-warmup-iters ({args.lr_warmup_iters})",
    )


def apply_custom_config(args: argparse.Namespace) -> None:
    """slime's --custom-config-path: every key of the YAML mapping is set on `args` as written (slime's
    rule, applied where slime applies it: after the argument checks, so nothing derived from a
    replaced value is recomputed; only the algorithm group's checks run after this). A key that is
    already an attribute is replaced, as slime does; the replaced values are kept in
    `args.custom_config_overrides` and named at start-up (`custom_config_note`). Two cases stop
    here where slime would carry on silently wrong: a value of another type than the argument's
    (YAML reads `1e-5` as a string), and a dashed key naming an argument (`rollout-batch-size`,
    which slime sets beside `rollout_batch_size` without replacing it)."""
    args.custom_config_overrides = {}
    path = args.custom_config_path
    if not path:
        return
    p = Path(path)
    if not p.is_file():
        raise SlimeError(f"--custom-config-path: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SlimeError(f"--custom-config-path {path}: invalid YAML: {e}") from e
    if data is None:
        return
    if not isinstance(data, dict):
        raise SlimeError(
            f"--custom-config-path {path}: expected a mapping of names to values, got a {type(data).__name__}"
        )
    overrides: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise SlimeError(f"--custom-config-path {path}: key {key!r} is not a string")
        if not hasattr(args, key) and hasattr(args, key.replace("-", "_")):
            # slime would set args.<key> as written and leave the argument as it was
            raise SlimeError(
                f"--custom-config-path {path}: key {key!r} is set as written, so it would not replace "
                f"args.{key.replace('-', '_')}; write {key.replace('-', '_')!r} to replace it"
            )
        if hasattr(args, key):
            old = getattr(args, key)
            _check_same_type(path, key, old, value)
            overrides[key] = old
        setattr(args, key, value)
    args.custom_config_overrides = overrides


def _check_same_type(path: str, key: str, old: Any, new: Any) -> None:
    """An argument replaced by the custom config keeps its kind of value (None: any)."""
    if old is None or new is None:
        return
    if isinstance(old, bool) or isinstance(new, bool):
        ok = isinstance(old, bool) and isinstance(new, bool)
    elif isinstance(old, float):
        ok = isinstance(new, (int, float))
    else:
        ok = isinstance(new, type(old)) or isinstance(old, type(new))
    if not ok:
        raise SlimeError(
            f"--custom-config-path {path}: {key!r} replaces args.{key} ({old!r}, a {type(old).__name__}) with "
            f"{new!r}, a {type(new).__name__}"
            + (
                " (YAML reads a number like 1e-5 as a string: write 1.0e-5)"
                if isinstance(new, str) and isinstance(old, (int, float))
                else ""
            )
        )


def custom_config_note(args: argparse.Namespace) -> str | None:
    """One start-up line naming the arguments --custom-config-path replaced (None when none)."""
    overrides = getattr(args, "custom_config_overrides", None)
    if not overrides:
        return None
    changes = "; ".join(f"{key}: {old!r} -> {getattr(args, key)!r}" for key, old in overrides.items())
    return f"--custom-config-path {args.custom_config_path} replaced arguments (slime's rule): {changes}"
