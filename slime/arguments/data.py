"""Prompt data: where it comes from, how a row becomes a prompt, and the data source holding it."""

from __future__ import annotations

import argparse
import json

from slime.arguments.checks import need, require_positive
from slime.arguments.rollout import DEFAULT_ROLLOUT_FUNCTION
from slime.errors import SlimeError

DEFAULT_DATA_SOURCE = "slime.rollout.data_source.RolloutDataSourceWithBuffer"  # slime's path
SFT_ROLLOUT_FUNCTION = "slime.rollout.sft_rollout.generate_rollout"
# slime.utils.mask_utils.MultiTurnLossMaskGenerator's chat-template strategies (slime's choices)
LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", type=str, default=None, help="JSONL (or Parquet) prompt file.")
    g.add_argument(
        "--input-key",
        type=str,
        default="input",
        help="Column of --prompt-data holding the prompt (a string, or a list of chat messages).",
    )
    g.add_argument(
        "--label-key",
        type=str,
        default=None,
        help="Column holding the label a reward reads (a reference answer, tests).",
    )
    g.add_argument(
        "--metadata-key",
        type=str,
        default="metadata",
        help="Column holding per-row metadata (an object, or a JSON string of one): sample.metadata.",
    )
    g.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="Render each prompt with the tokenizer's chat template, generation prompt added.",
    )
    g.add_argument("--apply-chat-template-kwargs", type=json.loads, default="{}", help="JSON dict.")
    g.add_argument(
        "--tool-key",
        type=str,
        default="tools",
        help="Column with the tools (a list, or a JSON string of one) passed to the chat template "
        "as `tools=` and kept in sample.metadata['tools'] (rows without it have none).",
    )
    g.add_argument(
        "--rollout-shuffle", action="store_true", help="Shuffle the prompts every epoch (seeded by --rollout-seed)."
    )
    g.add_argument(
        "--rollout-seed",
        type=int,
        default=42,
        help="Seed of the --rollout-shuffle order and, with --deterministic-mode (or "
        "--sglang-enable-deterministic-inference), of each sample's engine sampling_seed "
        "(--rollout-seed + its index in the group, as slime's).",
    )
    g.add_argument(
        "--rollout-max-prompt-len",
        type=int,
        default=None,
        help="Drop prompts longer than this many tokens at load time (counted in rollout/data/dropped_long_prompts).",
    )
    g.add_argument(
        "--num-epoch",
        type=int,
        default=None,
        help="Passes over --prompt-data; sets --num-rollout to num_epoch x prompts // "
        "--rollout-batch-size when --num-rollout is not given (counted when the run starts).",
    )
    _add_source_arguments(g)


def _add_source_arguments(g: argparse._ArgumentGroup) -> None:
    """Where a rollout's prompts come from: the data source, the Data Buffer, and the SFT loss mask."""
    g.add_argument(
        "--data-source-path",
        type=str,
        default=DEFAULT_DATA_SOURCE,
        help="Class (args) -> data source with get_samples(n) -> groups, add_samples(groups), "
        "save(rollout_id), load(rollout_id), __len__ (slime's DataSource).",
    )
    g.add_argument(
        "--buffer-filter-path",
        type=str,
        default=None,
        help="fn(args, rollout_id, buffer, num_samples) -> groups taken from the Data Buffer "
        "before new prompts (default: oldest first).",
    )
    g.add_argument(
        "--disable-rollout-global-dataset",
        action="store_false",
        dest="rollout_global_dataset",
        help="Do not load --prompt-data into the data source (slime's): the rollout function brings "
        "its own prompts; get_samples(n) hands out the Data Buffer's groups, then groups of empty "
        "Samples, and the data position is neither saved nor resumed. --prompt-data, if given, "
        "is only passed on in args. The built-in and SFT rollout functions need the dataset.",
    )
    g.add_argument(
        "--loss-mask-type",
        type=str,
        choices=LOSS_MASK_TYPES,
        default="qwen",
        help="Chat-template strategy of the SFT rollout's loss mask "
        "(slime.utils.mask_utils.MultiTurnLossMaskGenerator's tokenizer_type).",
    )


def finalize(args: argparse.Namespace) -> None:
    require_positive(args, "num_epoch", "rollout_max_prompt_len")
    if not args.rollout_global_dataset:
        _check_without_global_dataset(args)


def _check_without_global_dataset(args: argparse.Namespace) -> None:
    """--disable-rollout-global-dataset: nothing may count on prompts the data source no longer has."""
    need(
        args.num_epoch is None or args.num_rollout is not None,
        "--num-epoch counts passes over --prompt-data, which --disable-rollout-global-dataset does not "
        "load; set --num-rollout instead",
    )
    # slime's own rollout functions assert rollout_global_dataset; here they would get empty prompts
    if args.rollout_function_path in (DEFAULT_ROLLOUT_FUNCTION, SFT_ROLLOUT_FUNCTION):
        raise SlimeError(
            f"--rollout-function-path {args.rollout_function_path} takes its prompts from --prompt-data, which "
            "--disable-rollout-global-dataset does not load; give a rollout function that brings its own "
            "prompts, or drop --disable-rollout-global-dataset"
        )
