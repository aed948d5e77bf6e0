"""What a `--rollout-function-path` function may return (slime's `slime.rollout.base_types`).

A rollout function returns either a plain list of groups (lists of `Sample`) or
`RolloutFnTrainOutput(samples=groups, metrics={...})`; with `evaluation=True`, either
`{name: {"rewards": [...], "samples": [...]}}` or `RolloutFnEvalOutput(data=..., metrics=...)`.
Extra `metrics` are logged with the rollout's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RolloutFnTrainOutput:
    samples: list[Any]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, float] = field(default_factory=dict)


def unwrap_train_output(output: Any) -> tuple[list[Any], dict[str, float]]:
    if isinstance(output, RolloutFnTrainOutput):
        return output.samples, dict(output.metrics or {})
    return output, {}


def unwrap_eval_output(output: Any) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    if isinstance(output, RolloutFnEvalOutput):
        return output.data, dict(output.metrics or {})
    return output, {}
