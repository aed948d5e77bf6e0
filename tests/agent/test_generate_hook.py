"""`slime.agent.generate.generate` (the `--custom-generate-function-path` hook) with real agents
(tests/agent/agents.py) against a real engine that requires the run's key."""

from __future__ import annotations

import asyncio

import pytest
from conftest import ENGINE_KEY

from slime.errors import SlimeError
from slime.utils import api_keys
from slime.utils.types import Sample
from tests.helpers import make_args

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def run(engine, tiny_model_dir):
    from slime.agent import generate as hook
    from slime.rollout.sglang_rollout import GenerateState

    host, port = engine.url.removeprefix("http://").split(":")
    api_keys.register([engine.url], ENGINE_KEY)
    GenerateState.reset()

    def call(agent, *extra, prompt="3+4="):
        args = make_args(
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--sglang-router-ip",
            host,
            "--sglang-router-port",
            port,
            "--custom-generate-function-path",
            "slime.agent.generate.generate",
            "--agent-function-path",
            f"tests.agent.agents.{agent}",
            "--rollout-max-response-len",
            "4",
            "--sglang-tool-call-parser",
            "qwen25",
            *extra,
        )
        sample = Sample(index=5, group_index=2, prompt=prompt, label="7")
        params = {"temperature": 1.0, "max_new_tokens": 4, "top_p": 1.0}
        return asyncio.run(hook.generate(args, sample, params)), args

    yield call
    hook.shutdown()
    GenerateState.reset()
    api_keys._keys.pop(api_keys.origin(engine.url), None)


def test_a_two_turn_agent_is_one_sample_and_never_sees_the_engine_key(run):
    from slime.agent import generate as hook
    from tests.agent import agents

    s, args = run("two_turns")
    assert isinstance(s, Sample) and s.status == Sample.Status.COMPLETED and s.reward == 0.75
    assert (s.index, s.group_index, s.rollout_id) == (5, 2, 5) and s.session_id.startswith("agent-")
    assert sum(t["role"] == "model" for t in s.metadata["turns"]) == 2 and sum(s.loss_mask) <= 8
    base_url, key = agents.SEEN[-1]
    assert base_url.endswith("/v1") and key == s.session_id != ENGINE_KEY
    assert hook.agent_server(args).adapter.tool_parser == "qwen25"  # from --sglang-tool-call-parser


def test_none_reward_is_left_to_the_reward_model(run):
    s, _ = run("grade_later")
    assert s.reward is None and s.response_length == 4


def test_an_agent_that_never_calls_the_model_fails_its_sample(run):
    s, _ = run("never_calls")
    assert s.status == Sample.Status.FAILED and "made no model call" in s.metadata["error"]
    assert s.response_length == 0 and s.loss_mask == [] and s.tokens


def test_the_turn_cap_keeps_the_turns_so_far(run):
    samples, _ = run("until_refused", "--max-turns", "2")
    assert len(samples) == 2  # two unrelated single-turn conversations
    for s in samples:
        assert s.status == Sample.Status.TRUNCATED and s.reward is None
        assert s.metadata["agent_error"].startswith("RateLimitError")


def test_agent_option_errors(tiny_model_dir):
    from slime.agent.generate import check_agent_args
    from slime.preflight import check_hooks

    with pytest.raises(SlimeError, match="--agent-function-path needs --custom-generate-function-path"):
        make_args("--agent-function-path", "tests.agent.agents.two_turns")
    args = make_args(
        "--custom-generate-function-path",
        "slime.agent.generate.generate",
        "--agent-function-path",
        "tests.agent.agents.no_such_agent",
    )
    with pytest.raises(SlimeError, match="--agent-function-path"):
        check_hooks(args)
    args = make_args(
        "--custom-generate-function-path",
        "slime.agent.generate.generate",
        "--agent-function-path",
        "tests.agent.agents.two_turns",
        "--sglang-tool-call-parser",
        "qwen9",
    )
    with pytest.raises(SlimeError, match="--sglang-tool-call-parser 'qwen9' is not a known tool-call parser"):
        check_agent_args(args)
