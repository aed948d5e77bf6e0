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

ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "ppo")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")
LR_DECAY_STYLES = ("constant", "linear", "cosine")
OPD_TYPES = ("sglang", "megatron")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
TRAIN_BACKENDS = ("fsdp", "megatron")

DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"
DEFAULT_DATA_SOURCE = "slime.data.data_source.RolloutDataSourceWithBuffer"
# sglang-router's policies (kept in sync with slime.engine.router.ROUTER_POLICIES, tested)
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "consistent_hashing", "manual")


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
    g.add_argument("--update-weight-mode", choices=["tensor", "distributed"], default=None,
                   help="Weight sync into engines: 'tensor' posts safetensors bytes to /update_weights_from_tensor "
                        "(the built-in engine's payload; default with it); 'distributed' broadcasts over a gloo group "
                        "(/init_weights_update_group + /update_weights_from_distributed), as slime does for "
                        "non-colocated engines (default with --rollout-backend sglang).")
    g.add_argument("--update-weight-buffer-size", type=int, default=512 * 1024 ** 2,
                   help="Bytes per bucket of a distributed weight update (one HTTP call per bucket).")
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
    g.add_argument("--tool-key", type=str, default=None,
                   help="Column with the tools (a list, or a JSON string of one) passed to the chat template "
                        "as `tools=` and kept in sample.metadata['tools'].")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None,
                   help="Drop prompts longer than this many tokens at load time (counted in "
                        "rollout/data/dropped_long_prompts).")
    g.add_argument("--num-epoch", type=int, default=None,
                   help="Passes over --prompt-data; sets --num-rollout to num_epoch x prompts // "
                        "--rollout-batch-size when --num-rollout is not given.")
    g.add_argument("--data-source-path", type=str, default=DEFAULT_DATA_SOURCE,
                   help="Class (args) -> data source with get_samples(n) -> groups, add_samples(groups), "
                        "save(rollout_id), load(rollout_id), __len__ (slime's DataSource).")
    g.add_argument("--buffer-filter-path", type=str, default=None,
                   help="fn(args, rollout_id, buffer, num_samples) -> groups taken from the Data Buffer "
                        "before new prompts (default: oldest first).")

    g = p.add_argument_group("rollout")
    g.add_argument("--rollout-function-path", type=str, default=DEFAULT_ROLLOUT_FUNCTION)
    g.add_argument("--custom-generate-function-path", type=str, default=None)
    g.add_argument("--rm-type", type=str, default=None)
    g.add_argument("--custom-rm-path", type=str, default=None)
    g.add_argument("--reward-key", type=str, default=None, help="Key of a dict reward to train on.")
    g.add_argument("--group-rm", action="store_true",
                   help="Call the reward (--custom-rm-path or --rm-type) once per group with the whole group.")
    g.add_argument("--rm-url", type=str, default=None, help="The reward service of --rm-type remote_rm.")
    g.add_argument("--rm-timeout", type=float, default=120.0, help="Seconds per remote_rm request.")
    g.add_argument("--rm-max-retries", type=int, default=10, help="remote_rm attempts per sample, in all.")
    g.add_argument("--rm-retry-interval", type=float, default=1.0,
                   help="remote_rm back-off: this many seconds x 2^attempt (at most 30).")
    g.add_argument("--sandbox-timeout", type=float, default=10.0, help="--rm-type code: wall seconds per run.")
    g.add_argument("--sandbox-cpu-time", type=float, default=5.0, help="--rm-type code: CPU seconds per run.")
    g.add_argument("--sandbox-memory-mb", type=int, default=1024, help="--rm-type code: address-space limit.")
    g.add_argument("--sandbox-concurrency", type=int, default=2, help="--rm-type code: programs run at once.")
    g.add_argument("--dynamic-sampling-filter-path", type=str, default=None,
                   help="fn(args, samples) -> bool | DynamicFilterOutput; dropped groups are replaced "
                        "(e.g. slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std).")
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="Prompts fetched at a time while dynamic sampling refills (default --rollout-batch-size).")
    g.add_argument("--custom-reward-post-process-path", type=str, default=None,
                   help="fn(args, samples) -> (raw_rewards, rewards), replacing group normalisation.")
    g.add_argument("--custom-convert-samples-to-train-data-path", type=str, default=None,
                   help="fn(args, samples, raw_rewards, rewards) -> train data dict.")
    g.add_argument("--rollout-data-postprocess-path", type=str, default=None,
                   help="fn(args, rollout_id, rollout_data), on each trainer rank after advantages.")
    g.add_argument("--partial-rollout", action="store_true",
                   help="When enough groups are done, abort the rest and keep their partial responses in the "
                        "Data Buffer; the next rollout resumes them first.")
    g.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true",
                   help="With --partial-rollout: tokens generated before the resume (by older weights) get loss_mask 0.")
    g.add_argument("--rollout-sample-filter-path", type=str, default=None,
                   help="fn(args, samples) that sets sample.remove_sample on samples not to train on "
                        "(kept in their group and counted, loss mask zeroed).")
    g.add_argument("--max-turns", type=int, default=8,
                   help="Multi-turn trajectories (slime.rollout.multi_turn): most model turns per sample.")
    g.add_argument("--max-total-tokens", type=int, default=None,
                   help="Multi-turn trajectories: most prompt + response tokens per sample.")
    g.add_argument("--max-failed-sample-ratio", type=float, default=0.5,
                   help="Stop the run when more than this fraction of a rollout's samples FAILED "
                        "(a hook or reward that raised); failed samples are never trained on.")
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
    g.add_argument("--router-policy", choices=ROUTER_POLICIES, default="cache_aware",
                   help="sglang-router's policy in front of several engines (consistent_hashing or manual: "
                        "session affinity by the X-SMG-Routing-Key header).")
    g.add_argument("--rollout-backend", choices=("sglang", "builtin"), default=None,
                   help="Engine servers: real SGLang (GPUs) or the built-in CPU engine "
                        "(default: sglang when CUDA and the sglang package are present, else builtin).")

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
    # The rest of slime's algorithm suite (formulas in slime/algorithms, wiring in the trainer).
    g.add_argument("--disable-rewards-normalization", action="store_true",
                   help="Train on raw rewards (no group normalisation for grpo/gspo/rloo/reinforce_plus_plus_baseline).")
    g.add_argument("--normalize-advantages", action="store_true",
                   help="Whiten per-token advantages over the rollout (all ranks).")
    g.add_argument("--gamma", type=float, default=1.0, help="Discount (ppo GAE, reinforce_plus_plus).")
    g.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (ppo).")
    g.add_argument("--eps-clip-c", type=float, default=None, help="Dual-clip PPO lower bound (> 1).")
    g.add_argument("--value-clip", type=float, default=0.2, help="Clip of the critic's value loss (ppo).")
    g.add_argument("--kl-coef", type=float, default=0.0,
                   help="KL-to-reference penalty in the per-token reward (ppo, reinforce_plus_plus[_baseline]).")
    g.add_argument("--use-unbiased-kl", action="store_true", help="Importance-weight the KL loss by pi/pi_old.")
    g.add_argument("--use-tis", action="store_true", help="Truncated importance sampling for train/rollout mismatch.")
    g.add_argument("--tis-clip", type=float, default=2.0)
    g.add_argument("--tis-clip-low", type=float, default=0.0)
    g.add_argument("--use-opsm", action="store_true", help="Off-policy sequence masking.")
    g.add_argument("--opsm-delta", type=float, default=1e-4)
    g.add_argument("--use-opd", action="store_true", help="On-policy distillation (needs --opd-type).")
    g.add_argument("--opd-type", choices=OPD_TYPES, default=None,
                   help="megatron: teacher forward in the trainer (--opd-teacher-load); "
                        "sglang: samples carry teacher_log_probs from the rollout.")
    g.add_argument("--opd-kl-coef", type=float, default=1.0)
    g.add_argument("--opd-teacher-load", type=str, default=None, help="Teacher model directory (--opd-type megatron).")
    g.add_argument("--custom-loss-function-path", type=str, default=None, help="With --loss-type custom_loss.")
    g.add_argument("--custom-advantage-function-path", type=str, default=None,
                   help="fn(args, rollout_data) setting rollout_data['advantages'] and ['returns'].")
    g.add_argument("--ref-update-interval", type=int, default=None,
                   help="Copy the policy into the reference model every N rollouts.")
    g.add_argument("--keep-old-actor", action="store_true",
                   help="Keep a copy of the weights the engines serve; old log-probs come from it.")
    g.add_argument("--num-critic-only-steps", type=int, default=0, help="ppo: first N rollouts train the critic only.")
    g.add_argument("--critic-load", type=str, default=None, help="ppo critic backbone (default: --hf-checkpoint).")
    g.add_argument("--critic-lr", type=float, default=None, help="Default: --lr.")
    g.add_argument("--critic-lr-warmup-iters", type=int, default=0)
    g.add_argument("--overlong-buffer-len", type=int, default=None,
                   help="DAPO soft overlong penalty over the last N tokens of --rollout-max-response-len.")
    g.add_argument("--overlong-penalty-factor", type=float, default=1.0)

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam",), default="adam")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--lr-decay-style", choices=LR_DECAY_STYLES, default="constant")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None,
                   help="Default: all optimizer steps of the run (num_rollout x steps per rollout).")
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--global-batch-size", type=int, default=None, help="Samples per optimizer step.")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--num-steps-per-rollout", type=int, default=None)
    g.add_argument("--use-dynamic-batch-size", action="store_true",
                   help="Micro-batches packed (no padding) up to --max-tokens-per-gpu tokens; ignores --micro-batch-size.")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None)
    g.add_argument("--log-probs-chunk-size", type=int, default=-1, help="Rows per fp32 log-softmax chunk (-1: all).")
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
            # every value up to the next option (`--sglang-cuda-graph-bs 1 2 4` takes three)
            while "=" not in tok and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                passthrough.append(argv[i + 1])
                i += 1
        else:
            own.append(tok)
        i += 1
    return own, passthrough


def passthrough_value(tokens: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in forwarded engine arguments (`--flag v` or `--flag=v`), else None."""
    for i, tok in enumerate(tokens):
        if tok == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def passthrough_without(tokens: Sequence[str], flags: set[str]) -> list[str]:
    """Forwarded engine arguments with `flags` (and their values) removed."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(tokens):
        if skip:
            skip = False
            continue
        if tok.split("=", 1)[0] in flags:
            skip = "=" not in tok and i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            continue
        out.append(tok)
    return out


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
    if args.rollout_batch_size is None:
        raise SlimeError("--rollout-batch-size is required")
    if args.num_rollout is None and args.num_epoch is None:
        raise SlimeError("--num-rollout (or --num-epoch) is required")
    positive = ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "num_rollout",
                "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine",
                "rollout_max_response_len", "num_epoch", "rollout_max_prompt_len", "max_turns", "max_total_tokens")
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
    if not args.use_dynamic_batch_size and args.global_batch_size % (args.micro_batch_size * args.actor_world_size):
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
    if args.rollout_backend is None:
        from slime.engine.sglang_backend import default_rollout_backend

        args.rollout_backend = default_rollout_backend()
    if args.update_weight_mode is None:
        args.update_weight_mode = "distributed" if args.rollout_backend == "sglang" else "tensor"
    elif args.update_weight_mode == "tensor" and args.rollout_backend == "sglang":
        # SGLang's /update_weights_from_tensor takes torch multiprocessing handles (CUDA IPC), which
        # only a GPU trainer on the same machine can make; the tensor payload here is the built-in's
        raise SlimeError("--update-weight-mode tensor posts the built-in engine's safetensors payload, which "
                         "SGLang's /update_weights_from_tensor does not take (it wants CUDA IPC handles); with "
                         "--rollout-backend sglang use --update-weight-mode distributed")
    if args.num_rollout is None:
        args.num_rollout = _rollouts_for_epochs(args)
    check_algorithm_args(args)
    return args


def _rollouts_for_epochs(args: argparse.Namespace) -> int:
    """--num-epoch without --num-rollout: epochs x prompts // --rollout-batch-size (slime's rule).
    The prompts are counted as the data source will hand them out (after --rollout-max-prompt-len)."""
    from slime.utils.misc import load_function

    source_cls = load_function(args.data_source_path, arg_name="--data-source-path")
    num_prompts = len(source_cls(args))
    num_rollout = args.num_epoch * num_prompts // args.rollout_batch_size
    if num_rollout < 1:
        raise SlimeError(
            f"--num-epoch {args.num_epoch} over {num_prompts} prompts is less than one rollout of "
            f"--rollout-batch-size {args.rollout_batch_size}"
        )
    return num_rollout


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise SlimeError(message)


def check_algorithm_args(args: argparse.Namespace) -> None:
    """Cross-argument checks of the algorithm suite; each message names both arguments."""
    est, loss = args.advantage_estimator, args.loss_type
    sft_rollout = args.rollout_function_path.endswith("sft_rollout.generate_rollout")
    if args.use_dynamic_batch_size:
        _need(args.max_tokens_per_gpu is not None and args.max_tokens_per_gpu >= 1,
              "--use-dynamic-batch-size needs --max-tokens-per-gpu (>= 1)")
        _need(args.global_batch_size % args.actor_world_size == 0,
              f"--global-batch-size ({args.global_batch_size}) must be divisible by the data-parallel size "
              f"({args.actor_world_size}) with --use-dynamic-batch-size")
    else:
        _need(args.max_tokens_per_gpu is None, "--max-tokens-per-gpu only applies with --use-dynamic-batch-size")
    _need(args.update_weight_buffer_size >= 1,
          f"--update-weight-buffer-size must be >= 1 byte, got {args.update_weight_buffer_size}")
    _need(args.log_probs_chunk_size == -1 or args.log_probs_chunk_size >= 1,
          f"--log-probs-chunk-size must be -1 (no chunking) or >= 1, got {args.log_probs_chunk_size}")
    # loss types and hooks
    _need((loss == "custom_loss") == (args.custom_loss_function_path is not None),
          "--loss-type custom_loss and --custom-loss-function-path go together")
    if loss == "sft_loss":
        for flag, on in (("--use-tis", args.use_tis), ("--use-opsm", args.use_opsm), ("--use-opd", args.use_opd),
                         ("--use-kl-loss", args.use_kl_loss), ("--normalize-advantages", args.normalize_advantages),
                         ("--custom-advantage-function-path", args.custom_advantage_function_path)):
            _need(not on, f"{flag} has no effect with --loss-type sft_loss (no advantages, no policy ratio)")
        _need(est != "ppo", "--advantage-estimator ppo needs --loss-type policy_loss, not --loss-type sft_loss")
    # mismatch correction needs the engine's log-probs
    if args.use_tis or args.use_rollout_logprobs:
        flag = "--use-tis" if args.use_tis else "--use-rollout-logprobs"
        _need(not sft_rollout, f"{flag} needs rollout log-probs, which --rollout-function-path "
                               f"{args.rollout_function_path} (SFT data) does not produce")
    _need(args.tis_clip >= args.tis_clip_low >= 0,
          f"--tis-clip ({args.tis_clip}) must be >= --tis-clip-low ({args.tis_clip_low}) >= 0")
    _need(not (args.use_rollout_logprobs and args.keep_old_actor),
          "--use-rollout-logprobs and --keep-old-actor both choose the old policy; use one")
    _need(args.eps_clip_c is None or args.eps_clip_c > 1.0,
          f"--eps-clip-c (dual clip) must be > 1.0, got {args.eps_clip_c}")
    _need(args.eps_clip > 0 and args.eps_clip_high > 0, "--eps-clip and --eps-clip-high must be > 0")
    _need(0.0 <= args.gamma <= 1.0 and 0.0 <= args.lambd <= 1.0,
          f"--gamma ({args.gamma}) and --lambd ({args.lambd}) must be in [0, 1]")
    # KL in the reward only enters estimators with per-token rewards
    if args.kl_coef != 0.0:
        _need(est in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"),
              f"--kl-coef shapes per-token rewards of ppo / reinforce_plus_plus[_baseline]; "
              f"--advantage-estimator {est} ignores it (use --use-kl-loss with --kl-loss-coef)")
    _need(not args.use_unbiased_kl or args.use_kl_loss, "--use-unbiased-kl modifies the KL loss: add --use-kl-loss")
    needs_ref = args.use_kl_loss or args.kl_coef != 0.0
    if args.ref_update_interval is not None:
        _need(args.ref_update_interval >= 1, f"--ref-update-interval must be >= 1, got {args.ref_update_interval}")
        _need(needs_ref, "--ref-update-interval needs a reference model: add --use-kl-loss or --kl-coef")
    # critic
    if est == "ppo":
        if args.critic_load is None:
            args.critic_load = args.hf_checkpoint
        _need(args.critic_load is not None,
              "--advantage-estimator ppo needs a critic: give --critic-load (or --hf-checkpoint to start it from)")
        if args.critic_lr is None:
            args.critic_lr = args.lr
    else:
        for flag, on in (("--num-critic-only-steps", args.num_critic_only_steps),
                         ("--critic-load", args.critic_load), ("--critic-lr", args.critic_lr),
                         ("--critic-lr-warmup-iters", args.critic_lr_warmup_iters)):
            _need(not on, f"{flag} configures the critic, which only --advantage-estimator ppo uses (got {est})")
    _need(args.num_critic_only_steps >= 0, "--num-critic-only-steps must be >= 0")
    args.use_critic = est == "ppo"
    # on-policy distillation
    if args.use_opd:
        _need(args.opd_type is not None, "--use-opd needs --opd-type (megatron: teacher in the trainer; sglang: from rollout)")
        if args.opd_type == "megatron":
            _need(args.opd_teacher_load is not None, "--opd-type megatron needs --opd-teacher-load (the teacher model)")
    else:
        _need(args.opd_type is None and args.opd_teacher_load is None,
              "--opd-type / --opd-teacher-load need --use-opd")
    # DAPO overlong penalty
    if args.overlong_buffer_len is not None:
        _need(1 <= args.overlong_buffer_len <= args.rollout_max_response_len,
              f"--overlong-buffer-len ({args.overlong_buffer_len}) must be in [1, --rollout-max-response-len "
              f"({args.rollout_max_response_len})]")
    # learning-rate schedule
    _need(args.lr_warmup_iters >= 0 and args.critic_lr_warmup_iters >= 0, "--lr-warmup-iters must be >= 0")
    _need(0.0 <= args.min_lr <= args.lr, f"--min-lr ({args.min_lr}) must be in [0, --lr ({args.lr})]")
    total_steps = args.num_rollout * args.num_steps_per_rollout
    if args.lr_decay_iters is None:
        args.lr_decay_iters = total_steps
    _need(args.lr_decay_iters > args.lr_warmup_iters or args.lr_decay_style == "constant",
          f"--lr-decay-iters ({args.lr_decay_iters}) must exceed --lr-warmup-iters ({args.lr_warmup_iters})")


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
