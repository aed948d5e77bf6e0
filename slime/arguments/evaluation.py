"""Evaluation: data sets, schedule and sampling (each defaults to the rollout's)."""

from __future__ import annotations

import argparse

from slime.errors import SlimeError


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-function-path", type=str, default=None,
                   help="Rollout function for evaluation (default: --rollout-function-path).")
    g.add_argument("--eval-prompt-data", type=str, nargs="+", default=None, help="NAME PATH [NAME PATH ...] (one PATH alone: named aime, as slime's legacy form)")
    g.add_argument("--eval-input-key", type=str, default=None, help="Default: --input-key.")
    g.add_argument("--eval-label-key", type=str, default=None, help="Default: --label-key.")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-temperature", type=float, default=None, help="Default: --rollout-temperature.")
    g.add_argument("--eval-top-p", type=float, default=None, help="Default: --rollout-top-p.")
    g.add_argument("--eval-max-response-len", type=int, default=None, help="Default: --rollout-max-response-len.")
    g.add_argument("--skip-eval-before-train", action="store_true")


def finalize(args: argparse.Namespace) -> None:
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) == 1:
        # slime's legacy form: one path is the data set named "aime"
        args.eval_prompt_data = ["aime", args.eval_prompt_data[0]]
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) % 2:
        raise SlimeError("--eval-prompt-data takes pairs: NAME PATH [NAME PATH ...]")
    for own, rollout in (("eval_input_key", "input_key"), ("eval_label_key", "label_key"),
                         ("eval_temperature", "rollout_temperature"), ("eval_top_p", "rollout_top_p"),
                         ("eval_max_response_len", "rollout_max_response_len")):
        if getattr(args, own) is None:
            setattr(args, own, getattr(args, rollout))
