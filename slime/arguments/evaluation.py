"""Evaluation: data sets, schedule and sampling (each defaults to the rollout's).

Data sets come from `--eval-prompt-data NAME PATH ...` (all share the eval options) or from
`--eval-config FILE`, slime's multi-task YAML, where each has its own settings:

    eval:
      defaults: {temperature: 0.6, max_response_len: 1024}
      datasets:                       # a list of entries with `name`, or a mapping keyed by name
        - {name: aime, path: /data/aime.jsonl, n_samples_per_eval_prompt: 8, rm_type: math}

Either way `args.eval_datasets` holds one `EvalDatasetConfig` per data set (slime's attribute and
field names), each field resolved as slime resolves it: the data set's entry, then
`eval.defaults`, then the command line (the eval option, then the rollout one). `--eval-config`
wins over `--eval-prompt-data`, which is rewritten to the file's NAME PATH pairs (as slime does).
The file is read here, at parsing; the data files only at start-up (`slime/preflight.py`).
"""

from __future__ import annotations

import argparse
import logging

from slime.arguments.checks import flag, require_positive
from slime.errors import SlimeError
from slime.utils.eval_config import load_eval_config, resolve_eval_dataset

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("eval")
    g.add_argument(
        "--eval-interval",
        type=int,
        default=None,
        help="Evaluate before training (unless --skip-eval-before-train), then every N rollouts and at "
        "each epoch's end with --num-epoch (slime's rule: the last rollout only when one of those falls "
        "on it). Unset: no evaluation at all, whatever eval data sets are given.",
    )
    g.add_argument(
        "--eval-function-path",
        type=str,
        default=None,
        help="Rollout function for evaluation (default: --rollout-function-path).",
    )
    g.add_argument(
        "--eval-prompt-data",
        type=str,
        nargs="+",
        default=None,
        help="NAME PATH [NAME PATH ...] (one PATH alone: named aime, as slime's legacy form)",
    )
    g.add_argument(
        "--eval-config",
        type=str,
        default=None,
        help="slime's eval YAML (eval: {defaults: {...}, datasets: [...]}): each data set with its own "
        "keys, sampling and reward; replaces --eval-prompt-data.",
    )
    g.add_argument("--eval-input-key", type=str, default=None, help="Default: --input-key.")
    g.add_argument("--eval-label-key", type=str, default=None, help="Default: --label-key.")
    g.add_argument("--eval-tool-key", type=str, default=None, help="Default: --tool-key.")
    g.add_argument(
        "--n-samples-per-eval-prompt",
        type=int,
        default=1,
        help="Responses per eval prompt (pass@k is reported up to this k).",
    )
    g.add_argument("--eval-temperature", type=float, default=None, help="Default: --rollout-temperature.")
    g.add_argument("--eval-top-p", type=float, default=None, help="Default: --rollout-top-p.")
    g.add_argument("--eval-top-k", type=int, default=None, help="Default: --rollout-top-k.")
    g.add_argument("--eval-max-response-len", type=int, default=None, help="Default: --rollout-max-response-len.")
    g.add_argument(
        "--eval-max-prompt-len",
        type=int,
        default=None,
        help="Drop eval prompts longer than this many tokens at load time (counted per data set).",
    )
    g.add_argument(
        "--eval-min-new-tokens",
        type=int,
        default=None,
        help="min_new_tokens of each eval generate call (default: none).",
    )
    g.add_argument(
        "--eval-max-context-len",
        type=int,
        default=None,
        help="The engine's context during eval: each generate call asks for at most this minus the "
        "prompt's tokens (default: --rollout-max-context-len).",
    )
    g.add_argument("--skip-eval-before-train", action="store_true", help="Do not evaluate before the first rollout.")


def finalize(args: argparse.Namespace) -> None:
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) == 1:
        # slime's legacy form: one path is the data set named "aime"
        args.eval_prompt_data = ["aime", args.eval_prompt_data[0]]
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) % 2:
        raise SlimeError("--eval-prompt-data takes pairs: NAME PATH [NAME PATH ...]")
    for own, rollout in (
        ("eval_input_key", "input_key"),
        ("eval_label_key", "label_key"),
        ("eval_tool_key", "tool_key"),
        ("eval_temperature", "rollout_temperature"),
        ("eval_top_p", "rollout_top_p"),
        ("eval_top_k", "rollout_top_k"),
        ("eval_max_response_len", "rollout_max_response_len"),
        ("eval_max_context_len", "rollout_max_context_len"),
    ):
        if getattr(args, own) is None:
            setattr(args, own, getattr(args, rollout))
    require_positive(
        args, "n_samples_per_eval_prompt", "eval_max_response_len", "eval_max_prompt_len", "eval_max_context_len"
    )
    if args.eval_min_new_tokens is not None:
        if args.eval_min_new_tokens < 0:
            raise SlimeError(f"--eval-min-new-tokens must be >= 0, got {args.eval_min_new_tokens}")
        if args.eval_max_response_len is not None and args.eval_min_new_tokens > args.eval_max_response_len:
            raise SlimeError(
                f"--eval-min-new-tokens {args.eval_min_new_tokens} is more than the eval max response "
                f"length {args.eval_max_response_len} (--eval-max-response-len)"
            )
    _resolve_datasets(args)


def _resolve_datasets(args: argparse.Namespace) -> None:
    """`args.eval_datasets` from --eval-config or --eval-prompt-data; then eval_prompt_data names them."""
    if args.eval_config:
        if args.eval_prompt_data:
            logger.warning(
                "--eval-config %s replaces --eval-prompt-data %s (as in slime)",
                args.eval_config,
                " ".join(args.eval_prompt_data),
            )
        args.eval_datasets = load_eval_config(args.eval_config, args)
    else:
        pairs = list(args.eval_prompt_data or [])
        names = pairs[0::2]
        for name in names:
            if names.count(name) > 1:
                raise SlimeError(f"--eval-prompt-data names {name!r} twice (results are reported by name)")
        args.eval_datasets = [resolve_eval_dataset(args, n, p) for n, p in zip(names, pairs[1::2], strict=True)]
    args.eval_prompt_data = [x for c in args.eval_datasets for x in (c.name, c.path)] or None
    if args.eval_interval is not None and not args.eval_datasets:
        raise SlimeError(
            f"{flag('eval_interval')} {args.eval_interval} needs eval data sets (--eval-prompt-data or --eval-config)"
        )
    if args.eval_interval is None and args.eval_datasets:  # slime evaluates only with an interval
        logger.warning(
            "eval data sets are given but --eval-interval is not: the run does not evaluate (slime's rule); "
            "set --eval-interval N to evaluate before training and every N rollouts"
        )
