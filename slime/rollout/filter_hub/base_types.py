"""The `--dynamic-sampling-filter-path` contract (slime's `slime.rollout.filter_hub.base_types`).

`fn(args, samples) -> DynamicFilterOutput | bool` is called with one finished group; a group it
does not keep is dropped and replaced by a new prompt, unless the output says
`keep_when_insufficient` and dropping it would leave fewer groups (kept or still generating)
than the rollout needs: then it is kept, so no further round of sampling starts for it.
`reason` is counted in the rollout metrics as `rollout/dynamic_filter/drop_<reason>`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Call a filter; no filter keeps everything, and a plain bool answer is wrapped (the legacy form)."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    output = fn(*args, **kwargs)
    return output if isinstance(output, DynamicFilterOutput) else DynamicFilterOutput(keep=output)


def should_drop_dynamic_filter_output(
    output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int
) -> bool:
    """Whether a filtered group is dropped. `remaining_batch_size` counts the groups that could
    still fill the batch (kept or generating, this one included); `target_data_size` is the
    batch's number of groups."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)


class MetricGatherer:
    """Counts dropped groups per reason, as `rollout/dynamic_filter/drop_<reason>` metrics."""

    def __init__(self) -> None:
        self._drops: dict[str, int] = defaultdict(int)

    def on_dynamic_filter_drop(self, reason: str | None) -> None:
        if reason:
            self._drops[reason] += 1

    def collect(self) -> dict[str, int]:
        return {f"rollout/dynamic_filter/drop_{reason}": count for reason, count in self._drops.items()}
