"""A ready generate hook for agents written against the OpenAI API.

    --custom-generate-function-path slime.agent.generate.generate
    --agent-function-path my_agent.run          # async def run(base_url, api_key, sample) -> reward | None

Per rollout process, one `OpenAIAdapter` is served on 127.0.0.1 from a thread of its own
(`run_app_in_thread`) in front of the run's router/engine. For each sample the hook opens a session
with a fresh id, calls the agent with `base_url` (the adapter, ending in `/v1`) and that id as its
`api_key`, so plain SDK code works unchanged:

    async def run(base_url, api_key, sample):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        ...                                  # chat, tools, as many turns as it likes
        return 1.0 if solved else 0.0        # or None: the reward model grades the samples

and turns the session into samples (`TrajectoryManager`): usually one, several when the agent
rewrote its history (they share the sample's index, group and rollout_id). The agent never sees the
engine key; the adapter holds it.

Taken from the run's arguments: per-turn sampling defaults from the rollout's sampling params
(`--rollout-temperature`, `--rollout-max-response-len`, ...; a request's own `temperature`, `top_p`,
`max_tokens`, `stop` override them, as in slime); `--max-turns` is the adapter's
`max_turns_per_sid` (429 beyond it); `--max-total-tokens` (else `--rollout-max-context-len`) the
session's `max_context_tokens` (a longer prompt gets the API's context-length error);
`--sglang-tool-call-parser` / `--sglang-reasoning-parser` the parsers (`slime.engine.parsing`, shared
with the engine's /v1 routes).

Outcomes: a session with turns -> its samples (reward: the agent's, else None for the reward
model). An agent that raised (a 429 it did not catch, a bug) after some turns -> those samples,
TRUNCATED, `metadata["agent_error"]` saying why, reward from the reward model. An agent that made
no model call -> the sample FAILED with `metadata["error"]` (counted, never trained on).
"""

from __future__ import annotations

import inspect
import logging
import threading
import uuid
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import AutoTokenizer

from slime.agent.adapters.openai import OpenAIAdapter
from slime.agent.aiohttp_threaded import AppHandle, run_app_in_thread
from slime.engine.args import passthrough_value
from slime.engine.parsing import check_parser_names
from slime.errors import SlimeError
from slime.rollout.generation import GenerateState, engine_url, prompt_ids_of
from slime.utils.api_keys import key_for
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# the rollout's sampling params that are per-turn defaults of a session (the rest is the adapter's)
_SESSION_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "sampling_seed",
    "ignore_eos",
    "repetition_penalty",
)


@dataclass
class AgentServer:
    key: tuple
    adapter: OpenAIAdapter
    handle: AppHandle
    agent: Callable[..., Any]

    @property
    def base_url(self) -> str:
        return f"{self.handle.url}/v1"


_server: AgentServer | None = None
_lock = threading.Lock()


def engine_parser_option(args: Namespace, flag: str) -> str | None:
    """An `--sglang-<flag>` value the run was given, whether or not the engine itself uses it (the
    adapter parses the output it gets from /generate, whichever engine serves it)."""
    tokens = list(args.sglang_args) if hasattr(args, "sglang_args") else []
    for note in args.sglang_options_not_used if hasattr(args, "sglang_options_not_used") else []:
        name, _, value = note.partition(" ")
        tokens += ["--" + name.removeprefix("--sglang-"), *([value] if value else [])]
    return passthrough_value(tokens, flag)


def check_agent_args(args: Namespace) -> None:
    """Before anything starts: the parser names the adapter will use are known ones."""
    check_parser_names(
        engine_parser_option(args, "--tool-call-parser"),
        engine_parser_option(args, "--reasoning-parser"),
        tool_option="--sglang-tool-call-parser",
        reasoning_option="--sglang-reasoning-parser",
    )


def agent_server(args: Namespace) -> AgentServer:
    """This process's adapter (started on first use; restarted if the run's engine, model or agent
    changed)."""
    global _server
    if not args.agent_function_path:
        raise SlimeError(
            "--custom-generate-function-path slime.agent.generate.generate needs "
            "--agent-function-path (the agent: async def run(base_url, api_key, sample))"
        )
    url = engine_url(args, "").rstrip("/")
    key = (url, args.hf_checkpoint, args.agent_function_path)
    with _lock:
        if _server is not None and _server.key == key:
            return _server
        if _server is not None:
            _server.handle.stop()
            _server = None
        agent = load_function(args.agent_function_path, arg_name="--agent-function-path")
        if not callable(agent):
            raise SlimeError(f"--agent-function-path {args.agent_function_path}: not callable")
        adapter = OpenAIAdapter(
            # its own tokenizer: the adapter's thread must not share a Rust tokenizer with the rollout's
            tokenizer=AutoTokenizer.from_pretrained(args.hf_checkpoint),
            sglang_url=url,
            tool_parser=engine_parser_option(args, "--tool-call-parser"),
            reasoning_parser=engine_parser_option(args, "--reasoning-parser"),
            max_turns_per_sid=args.max_turns,
            engine_api_key=key_for(url + "/generate"),
            chat_template_kwargs=args.apply_chat_template_kwargs or {},
        )
        handle = run_app_in_thread(adapter.app, thread_name="slime-agent-adapter")
        _server = AgentServer(key, adapter, handle, agent)
        logger.info(
            "agent adapter (OpenAI API) at %s for --agent-function-path %s", _server.base_url, args.agent_function_path
        )
        return _server


def shutdown() -> None:
    """Stop this process's adapter (tests; the thread is a daemon otherwise)."""
    global _server
    with _lock:
        if _server is not None:
            _server.handle.stop()
            _server = None


async def generate(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    server = agent_server(args)
    adapter = server.adapter
    sid = f"agent-{uuid.uuid4().hex}"
    defaults = {k: sampling_params[k] for k in _SESSION_SAMPLING_KEYS if sampling_params.get(k) is not None}
    adapter.open_session(
        sid, sampling_defaults=defaults, max_context_tokens=args.max_total_tokens or args.rollout_max_context_len or 0
    )
    sample.session_id = sid
    error: BaseException | None = None
    reward = None
    try:
        reward = server.agent(server.base_url, sid, sample)
        if inspect.isawaitable(reward):
            reward = await reward
    except Exception as e:  # noqa: BLE001 - a failing agent: the turns so far are still the model's own (below)
        error = e
    samples = await adapter.finish_session(sid, base_sample=sample, reward=reward)
    if error is not None:
        if not samples:
            raise error
        logger.warning(
            "agent %s raised after %d sample(s) of session %s: %s: %s",
            args.agent_function_path,
            len(samples),
            sid,
            type(error).__name__,
            error,
        )
        for s in samples:
            s.status = Sample.Status.TRUNCATED
            s.reward = None
            s.metadata["agent_error"] = f"{type(error).__name__}: {error}"
    if not samples:
        sample.status = Sample.Status.FAILED
        sample.metadata["error"] = (
            f"--agent-function-path {args.agent_function_path}: the agent made no model "
            f"call (session {sid} had no turns)"
        )
        sample.tokens, sample.response_length, sample.loss_mask = prompt_ids_of(GenerateState(args), sample), 0, []
        sample.response, sample.rollout_log_probs = "", []
        sample.reward = reward if reward is not None else 0.0
        return sample
    return samples[0] if len(samples) == 1 else samples
