"""`Sample`: the unit of data that flows from rollout to training.

Field names follow slime's `slime.utils.types.Sample`, so a slime user's hooks run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """One prompt and (after rollout) one response, with everything training needs."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    # prompt: a string, or a list of chat messages before the chat template is applied
    prompt: str | list[dict[str, str]] = ""
    # tokens: prompt tokens followed by response tokens (exactly what the engine saw/produced)
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    # loss_mask: one entry per response token; 1 = trained on, 0 = not (e.g. tool output)
    loss_mask: list[int] | None = None
    # rollout_log_probs: the engine's log-prob of each response token when it was sampled
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # train_metadata: extra per-sample data a custom loss may need
    train_metadata: dict[str, Any] | None = None
    # session_id: one multi-turn trajectory; its requests carry it in the router's routing-key
    # header (`X-SMG-Routing-Key`), so `--router-policy consistent_hashing` keeps it on one engine
    session_id: str | None = None
    # weight_versions: the engine's weight version for each generate call that produced tokens of
    # this sample (several when a partial rollout resumed it after a weight update)
    weight_versions: list[str] = field(default_factory=list)
    # remove_sample: set by a --rollout-sample-filter-path hook; the sample stays in its group (the
    # group keeps its shape and it is counted) but its loss mask is zeroed: it is never trained on
    remove_sample: bool = False

    def get_reward_value(self, args: Any) -> float:
        """The scalar reward; a dict reward is read at `args.reward_key` (slime's convention)."""
        if isinstance(self.reward, dict):
            key = args.reward_key or "score"  # dapo-style {score, acc, pred} without --reward-key
            return float(self.reward[key])
        return float(self.reward if self.reward is not None else 0.0)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sample":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}  # tolerate state written by another version
        d["status"] = Sample.Status(d.get("status", "pending"))
        return cls(**d)
