"""What a `--rollout-function-path` function may return (slime's `slime.rollout.base_types`).

A rollout function returns either a plain list of groups (lists of `Sample`) or
`RolloutFnTrainOutput(samples=groups, metrics={...})`; with `evaluation=True`, either
`{name: {"rewards": [...], "samples": [...]}}` or `RolloutFnEvalOutput(data=..., metrics=...)`.
Extra `metrics` are logged with the rollout's own. `call_rollout_fn` calls one and always
hands back the wrapped form (slime's helper).
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


def call_rollout_fn(fn: Any, *args: Any, evaluation: bool, **kwargs: Any) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """`fn(*args, **kwargs, evaluation=evaluation)`, a plain answer wrapped in the output class."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return output
    return RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
