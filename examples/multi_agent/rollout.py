"""A `--rollout-function-path` where several cooperating agents solve each prompt together.

For every prompt the team runs `--n-samples-per-prompt` times in parallel. One team run is:

    solver     sees the problem                          -> proposes an answer
    reviewer   sees the problem and the proposal         -> writes a critique
    finalizer  sees the problem, proposal and critique   -> gives the final answer

The final answer is graded against the label (`--rm-type`, or `--custom-rm-path`), and that team
reward is the reward of every agent's turn. Each turn is its own trainable `Sample`: its prompt
is that agent's context (rendered with the tokenizer's chat template), its response the tokens
exactly as the engine generated them, with the engine's log-probs and a loss mask of ones.

Grouping: one group per (prompt, agent), holding that agent's turns from the n team runs. So a
group still has exactly `--n-samples-per-prompt` samples, GRPO compares an agent only with itself
on the same problem, and a rollout of `--rollout-batch-size` groups uses
`--rollout-batch-size / num_agents` prompts (the data source is asked for exactly that many).

The agents render their own contexts, so the prompt data is read as plain problem text (run
without `--apply-chat-template`). Evaluation (`evaluation=True`) is the default rollout on the
eval prompts with the chat template applied: the solver's exact context, so `eval/<name>`
measures the solver alone.
"""

from __future__ import annotations

import asyncio
import copy
import traceback
import uuid
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.errors import SlimeError
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.rm_hub import async_rm
from slime.rollout.sglang_rollout import GenerateState, engine_url
from slime.rollout.sglang_rollout import generate_rollout as default_generate_rollout
from slime.utils.async_utils import run
from slime.utils.http_utils import post, session_headers
from slime.utils.types import Sample

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Agent:
    """One role of the team: its name and how it sees the problem and the earlier turns."""

    role: str
    context: Callable[[str, dict[str, str]], Messages]  # (problem, answers so far by role) -> messages


def _solver(problem: str, transcript: dict[str, str]) -> Messages:
    return [{"role": "user", "content": problem}]


def _reviewer(problem: str, transcript: dict[str, str]) -> Messages:
    return [{"role": "user", "content": f"{problem}\nProposed answer: {transcript['solver']}\nCheck it."}]


def _finalizer(problem: str, transcript: dict[str, str]) -> Messages:
    return [
        {
            "role": "user",
            "content": (
                f"{problem}\nProposed answer: {transcript['solver']}\nReview: {transcript['reviewer']}\nFinal answer:"
            ),
        }
    ]


# The order is the order of the turns; the last agent's answer is graded.
AGENTS: tuple[Agent, ...] = (Agent("solver", _solver), Agent("reviewer", _reviewer), Agent("finalizer", _finalizer))
METRIC_PREFIX = "rollout/multi_agent"


def prompts_per_rollout(args: Namespace, num_agents: int = len(AGENTS)) -> int:
    """Prompts to fetch so that prompts x agents groups make exactly `--rollout-batch-size`."""
    if args.rollout_batch_size % num_agents:
        roles = ", ".join(a.role for a in AGENTS) if num_agents == len(AGENTS) else "custom agents"
        raise SlimeError(
            f"examples.multi_agent: --rollout-batch-size {args.rollout_batch_size} must be a multiple of the number "
            f"of agents, {num_agents} ({roles}): each prompt yields one group per agent, so a rollout uses "
            f"--rollout-batch-size / {num_agents} prompts"
        )
    return args.rollout_batch_size // num_agents


def problem_text(sample: Sample) -> str:
    """The raw problem: a prompt string, or the last user message of a chat prompt."""
    if isinstance(sample.prompt, list):
        users = [m["content"] for m in sample.prompt if m.get("role") == "user"]
        if not users:
            raise SlimeError(f"examples.multi_agent: sample {sample.index} has chat messages but no user message")
        return users[-1]
    return sample.prompt


def visible_text(tokenizer: Any, output_ids: list[int]) -> str:
    """What the next agent is shown of a turn: its text without special tokens (e.g. the end token)."""
    return tokenizer.decode(output_ids, skip_special_tokens=True).strip()


def turn_sample(
    base: Sample,
    role: str,
    role_index: int,
    num_agents: int,
    context_text: str,
    context_ids: list[int],
    output: dict[str, Any],
) -> Sample:
    """One agent turn as a trainable Sample: the engine's tokens and log-probs, untouched.

    `group_index` / `index` are derived from the data source's, so they stay unique per
    (prompt, agent) group and per sample; the original ones are kept in `metadata`.
    """
    meta = output["meta_info"]
    ids = list(output["output_ids"])
    logprobs = meta.get("output_token_logprobs")
    if logprobs is None or len(logprobs) != len(ids):
        raise SlimeError(f"engine returned {len(ids)} tokens but {0 if logprobs is None else len(logprobs)} log-probs")
    finish = (meta.get("finish_reason") or {}).get("type")
    status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED}.get(finish, Sample.Status.COMPLETED)
    version = meta.get("weight_version")
    return Sample(
        group_index=base.group_index * num_agents + role_index,
        index=base.index * num_agents + role_index,
        prompt=context_text,
        tokens=list(context_ids) + ids,
        response=output["text"],
        response_length=len(ids),
        label=base.label,
        loss_mask=[1] * len(ids),
        rollout_log_probs=[float(lp[0]) for lp in logprobs],
        status=status,
        metadata={
            **copy.deepcopy(base.metadata),
            "role": role,
            "prompt_group_index": base.group_index,
            "prompt_index": base.index,
        },
        session_id=base.session_id,
        weight_versions=[] if version is None else [str(version)],
    )


def failed_groups(
    base_group: list[Sample], context_ids: list[int], error: BaseException, agents: tuple[Agent, ...] = AGENTS
) -> list[list[Sample]]:
    """A prompt whose team runs broke: every agent's group, FAILED (kept, never trained on).

    The groups keep their shape so the rollout still has `--rollout-batch-size` groups; the
    run stops only if more than `--max-failed-sample-ratio` of all samples failed.
    """
    n = len(agents)
    groups = []
    for r, agent in enumerate(agents):
        group = []
        for s in base_group:
            f = Sample(
                group_index=s.group_index * n + r,
                index=s.index * n + r,
                prompt=s.prompt,
                tokens=list(context_ids),
                response_length=0,
                label=s.label,
                loss_mask=[],
                status=Sample.Status.FAILED,
                metadata={
                    **copy.deepcopy(s.metadata),
                    "role": agent.role,
                    "prompt_group_index": s.group_index,
                    "error": f"multi_agent team: {type(error).__name__}: {error}",
                    "traceback": "".join(traceback.format_exception(error)),
                },
            )
            group.append(f)
        groups.append(group)
    return groups


async def _generate_turns(
    args: Namespace, contexts: list[list[int]], sampling_params: dict[str, Any], session_id: str
) -> list[dict[str, Any]]:
    """One batched `/generate` for one agent's turn in all n team runs of a prompt."""
    state = GenerateState(args)
    payload = {"input_ids": contexts, "sampling_params": dict(sampling_params), "return_logprob": True}
    async with state.semaphore:
        outputs = await post(engine_url(args), payload, headers=session_headers(session_id))
    if not isinstance(outputs, list) or len(outputs) != len(contexts):
        raise SlimeError(f"engine answered a batch of {len(contexts)} with {type(outputs).__name__}")
    return outputs


async def run_team(args: Namespace, base_group: list[Sample], agents: tuple[Agent, ...] = AGENTS) -> list[list[Sample]]:
    """The n team runs of one prompt; returns one group per agent (n samples each), rewarded."""
    state = GenerateState(args)
    tok = state.tokenizer
    problem = problem_text(base_group[0])
    n = len(base_group)
    session = uuid.uuid4().hex  # all turns of this prompt go to one engine (prefix reuse)
    transcripts: list[dict[str, str]] = [{} for _ in range(n)]
    groups: list[list[Sample]] = []
    first_context: list[int] = []
    try:
        for r, agent in enumerate(agents):
            texts = [
                tok.apply_chat_template(agent.context(problem, t), tokenize=False, add_generation_prompt=True)
                for t in transcripts
            ]
            contexts = [tok(text, add_special_tokens=False)["input_ids"] for text in texts]
            first_context = first_context or contexts[0]
            outputs = await _generate_turns(args, contexts, state.sampling_params, session)
            group = [
                turn_sample(base, agent.role, r, len(agents), text, ids, out)
                for base, text, ids, out in zip(base_group, texts, contexts, outputs, strict=True)
            ]
            for t, out in zip(transcripts, outputs, strict=True):
                t[agent.role] = visible_text(tok, out["output_ids"])
            groups.append(group)
        await _reward_team(args, groups)
    except Exception as e:  # noqa: BLE001 - one broken prompt must not end the rollout: its samples are FAILED
        return failed_groups(base_group, first_context, e, agents)
    return groups


async def _reward_team(args: Namespace, groups: list[list[Sample]]) -> None:
    """Grade each run's final answer; its reward is every agent's reward in that run.

    The first agent's own answer is graded too (`metadata["own_reward"]`), to report how much
    the team adds over the solver alone.
    """
    finals, firsts = groups[-1], groups[0]
    team = await asyncio.gather(*(async_rm(args, s) for s in finals))
    own = await asyncio.gather(*(async_rm(args, s) for s in firsts))
    for run_index, reward in enumerate(team):
        for group in groups:
            group[run_index].reward = copy.deepcopy(reward)
        firsts[run_index].metadata["own_reward"] = own[run_index]


def multi_agent_metrics(
    args: Namespace, groups: list[list[Sample]], agents: tuple[Agent, ...] = AGENTS
) -> dict[str, float]:
    """Per-agent metrics: response length, truncation, trainable tokens; team and solver reward."""
    by_role: dict[str, list[Sample]] = {a.role: [] for a in agents}
    for group in groups:
        for s in group:
            by_role.setdefault(s.metadata.get("role", "?"), []).append(s)
    metrics: dict[str, float] = {}
    trainable = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    for role, samples in by_role.items():
        k = max(1, len(samples))
        metrics[f"{METRIC_PREFIX}/{role}_num_samples"] = float(len(samples))
        metrics[f"{METRIC_PREFIX}/{role}_response_len"] = sum(s.response_length for s in samples) / k
        metrics[f"{METRIC_PREFIX}/{role}_truncated_ratio"] = (
            sum(s.status == Sample.Status.TRUNCATED for s in samples) / k
        )
        metrics[f"{METRIC_PREFIX}/{role}_trainable_tokens"] = float(
            sum(sum(s.loss_mask or []) for s in samples if s.status in trainable)
        )
    finals = by_role.get(agents[-1].role, [])
    firsts = [s for s in by_role.get(agents[0].role, []) if "own_reward" in s.metadata]
    if finals:
        metrics[f"{METRIC_PREFIX}/team_reward"] = sum(s.get_reward_value(args) for s in finals) / len(finals)
    if firsts:
        metrics[f"{METRIC_PREFIX}/{agents[0].role}_own_reward"] = sum(
            Sample(reward=s.metadata["own_reward"]).get_reward_value(args) for s in firsts
        ) / len(firsts)
    metrics[f"{METRIC_PREFIX}/num_prompts"] = float(len(finals) // max(1, args.n_samples_per_prompt))
    return metrics


async def generate_rollout_async(args: Namespace, rollout_id: int, data_source: Any) -> RolloutFnTrainOutput:
    if args.apply_chat_template:
        raise SlimeError(
            "examples.multi_agent renders each agent's context with the chat template itself: "
            "run it without --apply-chat-template (evaluation still applies it, for the solver's view)"
        )
    num_prompts = prompts_per_rollout(args, len(AGENTS))
    base_groups = data_source.get_samples(num_prompts)
    teams = await asyncio.gather(*(run_team(args, g) for g in base_groups))
    groups = [group for team in teams for group in team]
    return RolloutFnTrainOutput(samples=groups, metrics=multi_agent_metrics(args, groups))


def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract. Training: the team; evaluation: the solver alone."""
    if evaluation:
        # Eval prompts rendered with the chat template are exactly the solver's context.
        eval_args = Namespace(**{**vars(args), "apply_chat_template": True})
        return default_generate_rollout(eval_args, rollout_id, data_source, evaluation=True)
    return run(generate_rollout_async(args, rollout_id, data_source))
