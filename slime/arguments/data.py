"""Prompt data: where it comes from, how a row becomes a prompt, and the data source holding it."""

from __future__ import annotations

import argparse
import json

from slime.arguments.checks import require_positive

DEFAULT_DATA_SOURCE = "slime.rollout.data_source.RolloutDataSourceWithBuffer"  # slime's path


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", type=str, default=None, help="JSONL (or Parquet) prompt file.")
    g.add_argument("--input-key", type=str, default="input")
    g.add_argument("--label-key", type=str, default=None)
    g.add_argument("--metadata-key", type=str, default="metadata")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--apply-chat-template-kwargs", type=json.loads, default="{}", help="JSON dict.")
    g.add_argument("--tool-key", type=str, default="tools",
                   help="Column with the tools (a list, or a JSON string of one) passed to the chat template "
                        "as `tools=` and kept in sample.metadata['tools'] (rows without it have none).")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None,
                   help="Drop prompts longer than this many tokens at load time (counted in "
                        "rollout/data/dropped_long_prompts).")
    g.add_argument("--num-epoch", type=int, default=None,
                   help="Passes over --prompt-data; sets --num-rollout to num_epoch x prompts // "
                        "--rollout-batch-size when --num-rollout is not given (counted when the run starts).")
    g.add_argument("--data-source-path", type=str, default=DEFAULT_DATA_SOURCE,
                   help="Class (args) -> data source with get_samples(n) -> groups, add_samples(groups), "
                        "save(rollout_id), load(rollout_id), __len__ (slime's DataSource).")
    g.add_argument("--buffer-filter-path", type=str, default=None,
                   help="fn(args, rollout_id, buffer, num_samples) -> groups taken from the Data Buffer "
                        "before new prompts (default: oldest first).")


def finalize(args: argparse.Namespace) -> None:
    require_positive(args, "num_epoch", "rollout_max_prompt_len")
