"""One argument parser for `slime train`, with slime's argument names.

* Names follow slime (`--rollout-batch-size`, `--n-samples-per-prompt`, ...), so a slime
  launch script needs only backend changes.
* `--sglang-<arg> [value]` is captured verbatim and forwarded to the engine as `--<arg>`
  (slime's own `--sglang-router-ip/port` and `--sglang-server-concurrency` excepted).
* `--config file.yaml` supplies the same arguments (keys with `-` or `_`); the command line wins.
* Every user error raises `SlimeError` naming the argument, with a "did you mean" hint,
  before any process is launched.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from slime.errors import SlimeError

# --sglang-* names that are slime's own arguments, not engine pass-through.
SLIME_OWNED_SGLANG_ARGS = ("--sglang-router-ip", "--sglang-router-port", "--sglang-server-concurrency")

ADVANTAGE_ESTIMATORS = ("grpo",)
LOSS_TYPES = ("policy_loss", "sft_loss")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
TRAIN_BACKENDS = ("fsdp", "megatron")

DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"


class _Parser(argparse.ArgumentParser):
    """argparse that raises SlimeError (with a suggestion) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = ""
        if "invalid choice" in message:
            bad = message.split("invalid choice: ", 1)[1].split(" (", 1)[0].strip("'\"")
            choices = message.split("choose from ", 1)[1].rstrip(")").replace("'", "").split(", ")
            close = difflib.get_close_matches(bad, choices, n=1)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        raise SlimeError(f"{message}{hint}")


def _str2bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if v.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {v!r}")


def build_parser() -> _Parser:
    p = _Parser(prog="slime train", description="RL post-training with slime's arguments.", allow_abbrev=False)
    p.add_argument("--config", type=str, default=None, help="YAML file of arguments (command line wins).")

    g = p.add_argument_group("cluster")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1,
                   help="Training ranks per node (on CPU: trainer processes).")
    g.add_argument("--rollout-num-gpus", type=int, default=None,
                   help="Total engine slots (on CPU: engine worker processes x per-engine).")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true",
                   help="Engines and trainers share the machine and take turns (engine frees its KV cache while training).")
    g.add_argument("--train-backend", choices=TRAIN_BACKENDS, default="fsdp")
    g.add_argument("--train-num-threads", type=int, default=None,
                   help="torch threads per trainer process (default: cores shared without oversubscription).")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--hf-checkpoint", type=str, default=None, help="Local Hugging Face model directory.")
    g.add_argument("--ref-load", type=str, default=None, help="Reference model (default: --hf-checkpoint).")
    g.add_argument("--load", type=str, default=None, help="Resume from the latest checkpoint in this directory.")
    g.add_argument("--save", type=str, default=None, help="Checkpoint directory (default: <run-dir>/checkpoints).")
    g.add_argument("--save-interval", type=int, default=None)

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", type=str, default=None, help="JSONL (or Parquet) prompt file.")
    g.add_argument("--input-key", type=str, default="input")
    g.add_argument("--label-key", type=str, default=None)
    g.add_argument("--metadata-key", type=str, default="metadata")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--apply-chat-template-kwargs", type=json.loads, default=None, help="JSON dict.")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)

    g = p.add_argument_group("rollout")
    g.add_argument("--rollout-function-path", type=str, default=DEFAULT_ROLLOUT_FUNCTION)
    g.add_argument("--custom-generate-function-path", type=str, default=None)
    g.add_argument("--rm-type", type=str, default=None)
    g.add_argument("--custom-rm-path", type=str, default=None)
    g.add_argument("--reward-key", type=str, default=None, help="Key of a dict reward to train on.")
    g.add_argument("--num-rollout", type=int, default=None)
    g.add_argument("--rollout-batch-size", type=int, default=None, help="Prompts per rollout.")
    g.add_argument("--n-samples-per-prompt", type=int, default=1)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop", type=str, nargs="+", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None)
    g.add_argument("--rollout-skip-special-tokens", action="store_true")
    g.add_argument("--sglang-server-concurrency", type=int, default=512,
                   help="Max in-flight requests per engine from the rollout client.")
    g.add_argument("--sglang-router-ip", type=str, default=None, help="Use an existing router/engine at this address.")
    g.add_argument("--sglang-router-port", type=int, default=None)

    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-function-path", type=str, default=None,
                   help="Rollout function for evaluation (default: --rollout-function-path).")
    g.add_argument("--eval-prompt-data", type=str, nargs="+", default=None, help="NAME PATH [NAME PATH ...]")
    g.add_argument("--eval-input-key", type=str, default=None, help="Default: --input-key.")
    g.add_argument("--eval-label-key", type=str, default=None, help="Default: --label-key.")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-temperature", type=float, default=None)
    g.add_argument("--eval-top-p", type=float, default=None)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--skip-eval-before-train", action="store_true")

    g = p.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", choices=ADVANTAGE_ESTIMATORS, default="grpo")
    g.add_argument("--disable-grpo-std-normalization", action="store_true")
    g.add_argument("--loss-type", choices=LOSS_TYPES, default="policy_loss")
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, default=None)
    g.add_argument("--use-kl-loss", action="store_true")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", choices=KL_LOSS_TYPES, default="k1")
    g.add_argument("--entropy-coef", type=float, default=0.0)
    g.add_argument("--calculate-per-token-loss", action="store_true")
    g.add_argument("--use-rollout-logprobs", action="store_true",
                   help="Use the engine's log-probs as the old policy instead of recomputing them.")

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam",), default="adam")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--global-batch-size", type=int, default=None, help="Samples per optimizer step.")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--num-steps-per-rollout", type=int, default=None)
    g.add_argument("--seed", type=int, default=1234)

    g = p.add_argument_group("logging")
    g.add_argument("--run-dir", type=str, default=None, help="Default: runs/<timestamp>.")
    g.add_argument("--use-tensorboard", action="store_true")
    g.add_argument("--check-weight-update-equal", action="store_true",
                   help="After each weight sync, compare engine and trainer log-probs on a fixed sequence.")
    g.add_argument("--stage", type=str, default=None, help="Stage name written with every metrics row.")
    return p


# ---------------------------------------------------------------------------------------
# --sglang-* pass-through and unknown arguments


def _split_passthrough(argv: Sequence[str], known_options: set[str]) -> tuple[list[str], list[str]]:
    """Separate `--sglang-<arg> [value]` (engine pass-through) from slime's own arguments."""
    own: list[str] = []
    passthrough: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name.startswith("--sglang-") and name not in known_options:
            passthrough.append("--" + tok[len("--sglang-"):])
            if "=" not in tok and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                passthrough.append(argv[i + 1])
                i += 1
        else:
            own.append(tok)
        i += 1
    return own, passthrough


def _suggest(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _config_to_argv(path: str, parser: _Parser, known_options: set[str]) -> list[str]:
    """Turn a YAML mapping into command-line tokens, checking every key."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise SlimeError(f"--config: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SlimeError(f"--config {path}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise SlimeError(f"--config {path}: expected a mapping of argument names to values")
    store_true = {a.option_strings[0] for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    argv: list[str] = []
    for key, value in data.items():
        opt = "--" + str(key).replace("_", "-")
        if opt not in known_options and not opt.startswith("--sglang-"):
            raise SlimeError(f"--config {path}: unknown key {key!r}{_suggest(opt, sorted(known_options))}")
        if opt in store_true or (opt.startswith("--sglang-") and isinstance(value, bool)):
            if not isinstance(value, bool):
                raise SlimeError(f"--config {path}: {key!r} is a flag; use true or false, got {value!r}")
            if value:
                argv.append(opt)
        elif isinstance(value, list):
            argv += [opt, *map(str, value)]
        elif isinstance(value, dict):
            argv += [opt, json.dumps(value)]
        elif value is not None:
            argv += [opt, str(value)]
    return argv


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate `slime train` arguments. Raises SlimeError on any user error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known = {s for a in parser._actions for s in a.option_strings}

    own, passthrough = _split_passthrough(argv, known)
    # --config first, so the command line overrides it.
    config_path = None
    for i, tok in enumerate(own):
        if tok == "--config" and i + 1 < len(own):
            config_path = own[i + 1]
        elif tok.startswith("--config="):
            config_path = tok.split("=", 1)[1]
    if config_path:
        cfg_own, cfg_pass = _split_passthrough(_config_to_argv(config_path, parser, known), known)
        own = cfg_own + own
        passthrough = cfg_pass + passthrough

    args, unknown = parser.parse_known_args(own)
    if unknown:
        bad = unknown[0]
        name = bad.split("=", 1)[0]
        if name.startswith("-"):
            raise SlimeError(f"unknown argument {name}{_suggest(name, sorted(known))}")
        raise SlimeError(f"unexpected value {bad!r} (no argument takes it)")
    args.sglang_args = passthrough
    finalize_args(args)
    return args


# ---------------------------------------------------------------------------------------
# derived values and cross-argument validation (no process is launched before this passes)


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.train_backend == "megatron":
        raise SlimeError(
            "--train-backend megatron needs GPUs and Megatron-LM, which this installation does not have; "
            "use --train-backend fsdp (the default)"
        )
    for name in ("rollout_batch_size", "num_rollout"):
        if getattr(args, name) is None:
            raise SlimeError(f"--{name.replace('_', '-')} is required")
    positive = ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "num_rollout",
                "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine",
                "rollout_max_response_len")
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SlimeError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.ref_load is None:
        args.ref_load = args.hf_checkpoint
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    if args.save is None:
        args.save = os.path.join(args.run_dir, "checkpoints")

    # Cluster shape. On CPU a "GPU" is a worker process slot.
    args.actor_world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = args.actor_world_size if args.colocate else args.rollout_num_gpus_per_engine
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise SlimeError(
            f"--rollout-num-gpus ({args.rollout_num_gpus}) must be a multiple of "
            f"--rollout-num-gpus-per-engine ({args.rollout_num_gpus_per_engine})"
        )
    args.num_engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine

    # Batching, as in slime: rollout_batch_size x n_samples_per_prompt samples per rollout,
    # global_batch_size samples per optimizer step, split evenly over data-parallel ranks.
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
    if args.global_batch_size % (args.micro_batch_size * args.actor_world_size):
        raise SlimeError(
            f"--global-batch-size ({args.global_batch_size}) must be divisible by --micro-batch-size "
            f"({args.micro_batch_size}) x data-parallel size ({args.actor_world_size}, from --actor-num-nodes x "
            f"--actor-num-gpus-per-node)"
        )
    args.num_steps_per_rollout = samples_per_rollout // args.global_batch_size

    if args.eval_prompt_data is not None and len(args.eval_prompt_data) % 2:
        raise SlimeError("--eval-prompt-data takes pairs: NAME PATH [NAME PATH ...]")
    if args.eval_input_key is None:
        args.eval_input_key = args.input_key
    if args.eval_label_key is None:
        args.eval_label_key = args.label_key
    if args.eval_temperature is None:
        args.eval_temperature = args.rollout_temperature
    if args.eval_top_p is None:
        args.eval_top_p = args.rollout_top_p
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    if (args.sglang_router_ip is None) != (args.sglang_router_port is None):
        raise SlimeError("--sglang-router-ip and --sglang-router-port must be given together")
    return args


def save_args(args: argparse.Namespace, path: str | os.PathLike) -> None:
    """Write the resolved arguments (JSON) so a run can be inspected and repeated."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(vars(args), indent=2, sort_keys=True, default=str) + "\n")


def to_argv(values: dict[str, Any]) -> list[str]:
    """{"rollout_batch_size": 32, "colocate": True} -> ["--rollout-batch-size", "32", "--colocate"]."""
    argv: list[str] = []
    for key, value in values.items():
        opt = "--" + key.replace("_", "-")
        if value is True:
            argv.append(opt)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [opt, *map(str, value)]
        else:
            argv += [opt, str(value)]
    return argv
