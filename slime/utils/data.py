"""slime's `slime.utils.data`: `Dataset` (a prompt file as `Sample`s, shuffled per epoch),
`read_file`, `filter_long_prompt`, `process_rollout_data` and `get_source`.

Rows are read by this repo's loader, slime.data.dataset (`iter_rows`, `load_prompt_samples`):
a malformed line or a missing key stops with a SlimeError naming file and line, where slime skips
a line that is not JSON; labels are kept as they are (any JSON value). slime's `path@[start:end]`
row slices work.
Prompts are text: multimodal keys or a processor raise SlimeError (the rollout here is text-only).
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

from slime.data.dataset import iter_rows, load_prompt_samples
from slime.errors import SlimeError
from slime.utils.types import Sample

__all__ = ["Dataset", "get_source", "read_file", "filter_long_prompt", "process_rollout_data"]

logger = logging.getLogger(__name__)

_SLICED_PATH = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def _parse_generalized_path(s: str) -> tuple[str, slice | None]:
    """`data.jsonl@[10:20]` -> ("data.jsonl", slice(10, 20)); a plain path -> (path, None)."""
    m = _SLICED_PATH.match(s)
    if m is None:
        return s, None
    start, end = (int(x) if x != "" else None for x in (m.group("start"), m.group("end")))
    return m.group("path"), slice(start, end)


def read_file(path: str) -> Iterator[dict]:
    """The rows (dicts) of a `.jsonl` or `.parquet` file, `path@[start:end]` slicing them."""
    real_path, row_slice = _parse_generalized_path(path)
    if not real_path.endswith((".jsonl", ".parquet")):
        raise ValueError(f"Unsupported file format: {real_path}. Supported formats are .jsonl and .parquet.")
    rows = (row for _, row in iter_rows(real_path))
    if row_slice is None:
        yield from rows
    elif (row_slice.start or 0) < 0 or (row_slice.stop or 0) < 0:
        yield from list(rows)[row_slice]  # a negative bound needs the row count
    else:
        yield from itertools.islice(rows, row_slice.start, row_slice.stop)


def filter_long_prompt(
    origin_samples: list[Sample], tokenizer: Any, processor: Any, max_length: int | None
) -> list[Sample]:
    """The samples whose (string) prompt is at most `max_length` tokens (no special tokens
    added); list prompts are not checked, as slime's."""
    if max_length is None or not origin_samples:
        return origin_samples
    if not isinstance(origin_samples[0].prompt, str):
        logger.warning("Skipping max_length check for list prompt. Set apply_chat_template=True to enable it.")
        return origin_samples
    if processor:
        raise SlimeError("filter_long_prompt: multimodal prompts (a processor) are not supported here")
    ids = tokenizer([s.prompt for s in origin_samples], add_special_tokens=False)["input_ids"]
    kept = [s for s, i in zip(origin_samples, ids, strict=True) if len(i) <= max_length]
    logger.info("Filtered %d samples longer than max_length=%s.", len(origin_samples) - len(kept), max_length)
    return kept


class Dataset:
    """The prompts of `path` as `Sample`s (`prompt`, `label`, `metadata`, tools in
    `metadata["tools"]`), those over `max_length` tokens dropped; `shuffle(epoch)` orders them by
    a permutation seeded with `seed + epoch`."""

    def __init__(
        self,
        path: str,
        tokenizer: Any,
        processor: Any,
        max_length: int | None,
        *,
        prompt_key: str = "text",
        multimodal_keys: dict | None = None,
        label_key: str | None = None,
        tool_key: str | None = None,
        metadata_key: str = "metadata",
        seed: int = 42,
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict | None = None,
    ) -> None:
        if multimodal_keys is not None or processor:
            raise SlimeError("Dataset: multimodal prompts (multimodal_keys, a processor) are not supported here")
        real_path, row_slice = _parse_generalized_path(path)
        samples = list(
            load_prompt_samples(
                real_path,
                input_key=prompt_key,
                label_key=label_key,
                metadata_key=metadata_key,
                tool_key=tool_key,
                tokenizer=tokenizer,
                apply_chat_template=apply_chat_template,
                apply_chat_template_kwargs=apply_chat_template_kwargs,
            )
        )
        if row_slice is not None:
            samples = samples[row_slice]
        self.origin_samples = filter_long_prompt(samples, tokenizer, processor, max_length)
        self.epoch_id = -1
        self.seed = seed
        self.samples = self.origin_samples

    def shuffle(self, new_epoch_id: int) -> None:
        if self.epoch_id == new_epoch_id:
            return
        order = list(range(len(self.samples)))
        random.Random(self.seed + new_epoch_id).shuffle(order)
        self.samples = [self.origin_samples[i] for i in order]
        self.epoch_id = new_epoch_id

    def __getitem__(self, idx: int) -> Sample:
        return self.samples[idx]

    def __len__(self) -> int:
        return len(self.samples)


def process_rollout_data(args: Namespace, rollout_data_ref: list[Any], dp_rank: int, dp_size: int) -> dict[str, Any]:
    """This data-parallel rank's rollout data from the Ray object refs (one `Box` per rank):
    `total_lengths` in the rank's `partition` order, and `local_raw_reward` (its samples'
    rewards) next to the whole batch's `raw_reward`."""
    import ray  # lazily: only a Ray worker calls this

    if len(rollout_data_ref) != dp_size:
        raise ValueError(f"{len(rollout_data_ref)} rollout data refs for {dp_size} data-parallel ranks")
    rollout_data = ray.get(rollout_data_ref[dp_rank].inner)
    partition = rollout_data["partition"]
    total_lengths = rollout_data["total_lengths"]
    rollout_data["total_lengths"] = [total_lengths[i] for i in partition]
    if "raw_reward" in rollout_data:
        rollout_data["local_raw_reward"] = [rollout_data["raw_reward"][i] for i in partition]
    return rollout_data


def get_source(sample: Sample) -> str:
    """The sample's data source: its `source` attribute, else `metadata["source_name"]`, else "unknown"."""
    if getattr(sample, "source", None):
        return sample.source
    metadata = sample.metadata or {}
    return metadata.get("source_name") or "unknown"
