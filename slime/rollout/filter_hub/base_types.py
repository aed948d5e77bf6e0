"""The `--dynamic-sampling-filter-path` contract (slime's `slime.rollout.filter_hub.base_types`).

`fn(args, samples) -> DynamicFilterOutput | bool` is called with one finished group; a group it
does not keep is dropped and replaced by a new prompt. `reason` is counted in the rollout
metrics as `rollout/dynamic_filter/drop_<reason>`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
