"""A session's turns -> training `Sample`s, from the engine's own tokens.

An adapter records each turn (`record_turn`): the prompt token ids it sent to the engine, the
output ids and log-probs the engine returned, the weight version, and the chat messages on both
sides. `get_trajectory` turns a session into samples:

* turns are packed into *segments*: a turn joins the segment whose tokens are a prefix of its
  prompt, token for token (the longest such segment); its prompt tail beyond the segment (tool
  results, user messages, template glue) is appended with loss_mask 0 and its output with
  loss_mask 1 and the engine's log-probs. A turn that extends no segment (the agent rewrote
  history: compaction, a sub-agent with its own context, an edited message) opens a new one.
  A session whose every turn extends the previous prompt is one sample.
* every segment becomes one `Sample` (prompt = its first turn's prompt); the segments of a session
  share the base sample's `index`, `group_index` and `rollout_id` (so the loss averages per agent
  run) and carry `metadata["segment"]`, `metadata["num_segments"]`, `metadata["turns"]` (spans of
  the response) and `session_id`.

No text the model produced is ever re-tokenised here: trained tokens are the engine's output
ids. (The adapters keep prompts token-exact by splicing a recorded turn's ids back in when the
agent replays it: see `slime.agent.adapters.common`.)

Slime's public names: `TrajectoryManager`, `TurnRecord`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from slime.utils.types import Sample

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """One engine `/generate` call of a session: exactly what was sent and what came back."""

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    output_log_probs: list[float] = dataclasses.field(default_factory=list)
    ill_formed: bool = False
    weight_version: str | None = None


@dataclasses.dataclass
class _Turn:
    record: TurnRecord
    prompt_messages: list[dict[str, Any]]
    response_message: dict[str, Any] | None
    metadata: dict[str, Any]


@dataclasses.dataclass
class _Segment:
    prompt_len: int
    tokens: list[int]
    loss_mask: list[int]  # one per token (prompt included)
    log_probs: list[float]
    weight_versions: list[str]
    turns: list[dict[str, Any]]
    last_finish: str
    tool_calls: bool = False
    ill_formed: bool = False

    @classmethod
    def opened_by(cls, rec: TurnRecord) -> _Segment:
        """A new segment whose prompt is `rec`'s."""
        return cls(
            prompt_len=len(rec.prompt_ids),
            tokens=list(rec.prompt_ids),
            loss_mask=[0] * len(rec.prompt_ids),
            log_probs=[0.0] * len(rec.prompt_ids),
            weight_versions=[],
            turns=[],
            last_finish=rec.finish_reason,
        )

    def add_context(self, tail: list[int]) -> None:
        """A turn's prompt beyond the segment (tool results, user messages, template glue): loss_mask 0."""
        if tail:
            self.turns.append(
                {
                    "role": "context",
                    "start": len(self.tokens) - self.prompt_len,
                    "end": len(self.tokens) - self.prompt_len + len(tail),
                }
            )
        self.tokens += tail
        self.loss_mask += [0] * len(tail)
        self.log_probs += [0.0] * len(tail)

    def add_output(self, t: _Turn) -> None:
        """A turn's output: the engine's ids, loss_mask 1 and the engine's log-probs."""
        rec = t.record
        start = len(self.tokens) - self.prompt_len
        self.tokens += rec.output_ids
        self.loss_mask += [1] * len(rec.output_ids)
        self.log_probs += list(rec.output_log_probs) if rec.output_log_probs else [0.0] * len(rec.output_ids)
        if rec.weight_version is not None:
            self.weight_versions.append(str(rec.weight_version))
        self.turns.append(
            {
                "role": "model",
                "start": start,
                "end": start + len(rec.output_ids),
                "finish_reason": rec.finish_reason,
                "weight_version": rec.weight_version,
            }
        )
        self.last_finish = rec.finish_reason
        self.tool_calls |= bool((t.response_message or {}).get("tool_calls"))
        self.ill_formed |= rec.ill_formed


def _extends(prefix: list[int], ids: list[int]) -> bool:
    return len(prefix) <= len(ids) and ids[: len(prefix)] == prefix


def _pack_segments(turns: list[_Turn]) -> list[_Segment]:
    """Each turn joins the longest segment whose tokens are a prefix of its prompt, else opens one."""
    segments: list[_Segment] = []
    for t in turns:
        rec = t.record
        best = None
        for seg in segments:
            if _extends(seg.tokens, rec.prompt_ids) and (best is None or len(seg.tokens) > len(best.tokens)):
                best = seg
        if best is None:
            best = _Segment.opened_by(rec)
            segments.append(best)
        else:
            best.add_context(rec.prompt_ids[len(best.tokens) :])
        best.add_output(t)
    return segments


def _segment_sample(
    seg: _Segment,
    i: int,
    num_segments: int,
    sid: str,
    base_sample: Sample,
    reward: float | dict | None,
    extra_metadata: dict[str, Any] | None,
    max_sample_tokens: int,
) -> Sample | None:
    """Segment `i` of a session as a training sample; None when the cut to `max_sample_tokens`
    leaves nothing of its response."""
    tokens, mask, lps = seg.tokens, seg.loss_mask, seg.log_probs
    truncated = seg.last_finish == "length"
    if max_sample_tokens and len(tokens) > max_sample_tokens:
        tokens, mask, lps = tokens[:max_sample_tokens], mask[:max_sample_tokens], lps[:max_sample_tokens]
        truncated = True
    if len(tokens) <= seg.prompt_len:  # nothing of the response left after the cut
        return None
    md = {
        **(base_sample.metadata or {}),
        **(extra_metadata or {}),
        "sid": sid,
        "segment": i,
        "num_segments": num_segments,
        "turns": seg.turns,
        "truncated": truncated,
        "use_tool": seg.tool_calls,
        "ill_formed": seg.ill_formed,
    }
    return Sample(
        index=base_sample.index,
        group_index=base_sample.group_index,
        rollout_id=base_sample.rollout_id if base_sample.rollout_id is not None else base_sample.index,
        prompt=base_sample.prompt,
        label=base_sample.label,
        tokens=list(tokens),
        response_length=len(tokens) - seg.prompt_len,
        loss_mask=mask[seg.prompt_len :],
        rollout_log_probs=lps[seg.prompt_len :],
        weight_versions=seg.weight_versions,
        reward=reward,
        status=Sample.Status.COMPLETED,  # as slime: truncation is metadata["truncated"]
        metadata=md,
        session_id=sid,
        custom_rm_path=base_sample.custom_rm_path,
        train_metadata=base_sample.train_metadata,
    )


class TrajectoryManager:
    """Per-session turn records (thread-safe: adapters record on their server thread, the rollout
    reads on its own)."""

    def __init__(self) -> None:
        self._turns: dict[str, list[_Turn]] = {}
        self._lock = threading.Lock()

    def has_session(self, sid: str) -> bool:
        with self._lock:
            return sid in self._turns

    def turn_count(self, sid: str) -> int:
        with self._lock:
            return len(self._turns.get(sid, ()))

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: list[dict[str, Any]],
        response_message: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if turn.output_log_probs and len(turn.output_log_probs) != len(turn.output_ids):
            raise ValueError(f"turn has {len(turn.output_ids)} output ids but {len(turn.output_log_probs)} log-probs")
        with self._lock:
            self._turns.setdefault(sid, []).append(
                _Turn(turn, list(prompt_messages), response_message, dict(metadata or {}))
            )

    def match_history(self, sid: str, messages: list[dict[str, Any]]) -> tuple[int, TurnRecord] | None:
        """The latest assistant message of `messages` that is a recorded turn's reply replayed with
        the same history before it: (its index, that turn); None when there is none."""
        with self._lock:
            turns = list(self._turns.get(sid, ()))
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].get("role") != "assistant":
                continue
            for t in reversed(turns):
                if t.response_message == messages[k] and t.prompt_messages == messages[:k]:
                    return k, t.record
        return None

    def drop_session(self, sid: str) -> None:
        with self._lock:
            self._turns.pop(sid, None)

    def get_trajectory(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float | dict | None = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> list[Sample]:
        """The session's samples (one per segment), consuming the session; [] for a session with
        no turns (a second call included)."""
        with self._lock:
            turns = self._turns.pop(sid, [])
        segments = _pack_segments(turns)
        samples = [
            _segment_sample(seg, i, len(segments), sid, base_sample, reward, extra_metadata, max_sample_tokens)
            for i, seg in enumerate(segments)
        ]
        return [s for s in samples if s is not None]


__all__ = ["TrajectoryManager", "TurnRecord"]
