"""Multi-turn and tool-use trajectories, token in, token out.

A trajectory is one `Sample` whose response interleaves the model's turns with what tools or
an environment answered. The trained tokens are exactly the tokens the engine produced (never
re-tokenized from text); tool and environment output is tokenized once, appended, and masked
out of the loss:

    prompt | model turn 1 | tool output 1 | model turn 2 | ...
             loss_mask 1     loss_mask 0     loss_mask 1
             engine logps    0.0             engine logps

Every model turn is one `/generate` call on the whole token sequence so far, carrying the
trajectory's `session_id` in the router's routing-key header, so with
`--router-policy consistent_hashing` all turns land on one engine and reuse its prefix cache.
Turn boundaries, each turn's finish reason and weight version are kept in
`sample.metadata["turns"]`, so per-turn log-probs can be read back from `rollout_log_probs`.

    async def generate(args, sample, sampling_params):       # a --custom-generate-function-path
        async def env_step(text, trajectory):                # the model's last turn, as text
            if "<answer>" in text:
                return None                                  # done
            return "<result>" + run_tool(text) + "</result>" # appended with loss_mask 0
        return await run_multi_turn(args, sample, sampling_params, env_step, max_turns=4)
"""

from __future__ import annotations

import inspect
import uuid
from argparse import Namespace
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from slime.rollout.sglang_rollout import GenerateState, engine_url, prompt_ids_of
from slime.utils.http_utils import post, session_headers
from slime.utils.types import Sample

# env_step(model_text, trajectory) -> observation text, observation token ids, or None (finished)
EnvStep = Callable[[str, "Trajectory"], str | list[int] | None | Awaitable[str | list[int] | None]]


@dataclass
class Turn:
    """One span of the response: `tokens[prompt_length + start : prompt_length + end]`."""

    role: str  # "model" or "env"
    start: int
    end: int
    finish_reason: str | None = None  # model turns: stop | length | abort
    weight_version: str | None = None  # model turns: the engine's weights that produced them


class Trajectory:
    """Builds one sample's response from model turns and environment turns."""

    def __init__(self, sample: Sample, prompt_ids: list[int], max_turns: int = 8):
        self.sample = sample
        self.max_turns = max_turns
        self.prompt_length = len(prompt_ids)
        self.turns: list[Turn] = []
        sample.tokens = list(prompt_ids)
        sample.response = ""
        sample.response_length = 0
        sample.loss_mask = []
        sample.rollout_log_probs = []
        sample.weight_versions = []
        sample.metadata["turns"] = []

    @property
    def num_model_turns(self) -> int:
        return sum(t.role == "model" for t in self.turns)

    @property
    def turns_left(self) -> int:
        """Model turns still allowed after the current one (0: an observation would not be used,
        so an env_step may skip expensive work, e.g. running a tool)."""
        return max(0, self.max_turns - self.num_model_turns)

    def _append(self, turn: Turn, token_ids: list[int], text: str, mask: int, logprobs: list[float]) -> None:
        s = self.sample
        s.tokens.extend(token_ids)
        s.response += text
        s.response_length += len(token_ids)
        s.loss_mask.extend([mask] * len(token_ids))
        s.rollout_log_probs.extend(logprobs)
        self.turns.append(turn)
        s.metadata["turns"].append(asdict(turn))

    def add_model_turn(self, output: dict[str, Any]) -> str:
        """Append one `/generate` answer exactly as produced; return its text."""
        meta = output["meta_info"]
        ids = list(output["output_ids"])
        logprobs = [float(lp[0]) for lp in meta.get("output_token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise ValueError(f"engine returned {len(ids)} tokens but {len(logprobs)} log-probs (return_logprob off?)")
        start = self.sample.response_length
        finish = (meta.get("finish_reason") or {}).get("type")
        version = meta.get("weight_version")
        if version is not None:
            self.sample.weight_versions.append(str(version))
        turn = Turn("model", start, start + len(ids), finish, None if version is None else str(version))
        self._append(turn, ids, output["text"], 1, logprobs)
        return output["text"]

    def add_env_turn(self, token_ids: list[int], text: str) -> None:
        """Append tool/environment output: not the policy's tokens, so loss_mask 0 (log-prob 0.0)."""
        start = self.sample.response_length
        self._append(Turn("env", start, start + len(token_ids)), list(token_ids), text, 0, [0.0] * len(token_ids))


@dataclass
class _Room:
    """What the trajectory may still add: the response budget (model and environment tokens
    together), and prompt plus response within `max_total_tokens`."""

    sample: Sample
    response_budget: int | None
    max_total_tokens: int | None

    def left(self) -> int | None:
        """Tokens the trajectory may still add (None: no limit but the engine's context length)."""
        limits = [] if self.response_budget is None else [int(self.response_budget) - self.sample.response_length]
        if self.max_total_tokens is not None:
            limits.append(self.max_total_tokens - len(self.sample.tokens))
        return min(limits) if limits else None

    def exhausted(self) -> bool:
        left = self.left()
        return left is not None and left <= 0


def _stop(sample: Sample, status: Sample.Status, reason: str) -> Sample:
    sample.status = status
    sample.metadata["stop_reason"] = reason
    return sample


async def _model_turn(
    args: Namespace,
    sample: Sample,
    sampling_params: dict[str, Any],
    room_left: int | None,
    max_new_tokens_per_turn: int | None,
) -> dict[str, Any]:
    """One `/generate` call on the whole sequence so far, capped by the room left and the per-turn cap."""
    params = dict(sampling_params)
    caps = [c for c in (room_left, max_new_tokens_per_turn) if c is not None]
    params["max_new_tokens"] = min(caps) if caps else None
    return await post(
        engine_url(args),
        {"input_ids": list(sample.tokens), "sampling_params": params, "return_logprob": True},
        headers=session_headers(sample.session_id),
    )


async def run_multi_turn(
    args: Namespace,
    sample: Sample,
    sampling_params: dict[str, Any],
    env_step: EnvStep,
    *,
    max_turns: int | None = None,
    max_total_tokens: int | None = None,
    max_new_tokens_per_turn: int | None = None,
    tokenizer: Any = None,
) -> Sample:
    """Alternate model turns and `env_step` until it returns None, or a limit is hit.

    Limits: `max_turns` model turns (default `--max-turns`; the observation after the last one
    is not appended, and `trajectory.turns_left == 0` tells `env_step` so); the response as a whole is at most
    `sampling_params["max_new_tokens"]` tokens, model and environment together; prompt plus
    response at most `max_total_tokens` (default `--max-total-tokens`, else unbounded). Status:
    COMPLETED when `env_step` ends it, TRUNCATED when a limit ends it (`metadata["stop_reason"]`
    says which), ABORTED when the engine aborted a turn. A trajectory always starts from the
    prompt (an aborted one is generated again, not resumed).
    """
    state = GenerateState(args)
    tokenizer = tokenizer or state.tokenizer
    if max_turns is None:
        max_turns = args.max_turns
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if max_total_tokens is None:
        max_total_tokens = args.max_total_tokens
    # a response budget of None: only the engine's context bounds it
    room = _Room(sample, sampling_params.get("max_new_tokens", 1024), max_total_tokens)
    if sample.session_id is None:  # one routing key per trajectory: all its turns go to one engine
        sample.session_id = uuid.uuid4().hex
    traj = Trajectory(sample, prompt_ids_of(state, sample), max_turns)

    while True:
        if room.exhausted():
            return _stop(sample, Sample.Status.TRUNCATED, "max_tokens")
        if state.aborted:  # a partial rollout is collecting: send nothing new
            return _stop(sample, Sample.Status.ABORTED, "abort")
        output = await _model_turn(args, sample, sampling_params, room.left(), max_new_tokens_per_turn)
        text = traj.add_model_turn(output)
        finish = traj.turns[-1].finish_reason
        if finish == "abort":
            return _stop(sample, Sample.Status.ABORTED, "abort")
        # with no limit of ours, a turn cut by length (not by the per-turn cap) filled the context
        if finish == "length" and (room.exhausted() or (room.left() is None and not max_new_tokens_per_turn)):
            return _stop(sample, Sample.Status.TRUNCATED, "max_tokens")
        observation = env_step(text, traj)
        if inspect.isawaitable(observation):
            observation = await observation
        if observation is None:
            return _stop(sample, Sample.Status.COMPLETED, "env_done")
        if traj.turns_left == 0:  # no model turn would read it: not appended
            return _stop(sample, Sample.Status.TRUNCATED, "max_turns")
        ids = (
            list(observation)
            if isinstance(observation, list)
            else tokenizer.encode(observation, add_special_tokens=False)
        )
        left = room.left()
        if left is not None and len(ids) >= left:  # the observation would leave no room for another model turn
            ids = ids[: max(0, left)]
            traj.add_env_turn(ids, tokenizer.decode(ids))
            return _stop(sample, Sample.Status.TRUNCATED, "max_tokens")
        traj.add_env_turn(ids, observation if isinstance(observation, str) else tokenizer.decode(ids))
