"""The coding-agent example: sandboxed tool calls in the trajectory, test-based rewards, a real run.

The hook tests drive `generate` against a scripted stand-in for the engine's `/generate` (the
only fake here: a random tiny model would almost never write `<code>`); every program runs in the
real sandbox. The e2e test is a real short training run.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from slime.utils.types import Sample
from tests.examples.hook_testing import ScriptedEngine, run_hook, train_argv

pytestmark = pytest.mark.usefixtures("fresh_generate_state")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "coding_agent"

# A correct solution for each task in data.jsonl, in order: the data's tests must accept them.
REFERENCE = [
    "def add(a, b):\n    return a + b",
    "def is_even(n):\n    return n % 2 == 0",
    "def reverse(s):\n    return s[::-1]",
    "def factorial(n):\n    return 1 if n == 0 else n * factorial(n - 1)",
    "def largest(xs):\n    return max(xs)",
    "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
    "def fizz(n):\n    return 'Fizz' if n % 3 == 0 else str(n)",
    "n = int(input())\nprint(n * n)",
]


async def reward_through_hook(args: Namespace, sample: Sample) -> float:
    """The example's reward, after checking the sample really came through the hook's multi-turn
    driver (used by the e2e run: raising here marks the sample FAILED, which the test rules out;
    the random model itself will hardly ever write `<code>`)."""
    from examples.coding_agent.reward import reward

    turns = sample.metadata.get("turns")
    if not turns or turns[0]["role"] != "model" or len(sample.loss_mask) != sample.response_length:
        raise AssertionError(f"sample {sample.index} did not come through run_multi_turn: {turns}")
    return await reward(args, sample)


@pytest.fixture
def hook_env(tiny_model_dir, tmp_path) -> tuple[Namespace, Any]:
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    args = parse_args(train_argv("coding_agent", tiny_model_dir, tmp_path / "run"))
    return args, GenerateState(args).tokenizer


def _sample(tokenizer: Any, task: str, tests: Any) -> Sample:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": task}], tokenize=False, add_generation_prompt=True
    )
    return Sample(
        index=0,
        prompt=prompt,
        label=tests if isinstance(tests, str) else "",
        metadata={} if isinstance(tests, str) else {"tests": tests},
    )


def _run(
    args: Namespace, tokenizer: Any, turns: list[str], sample: Sample, max_new_tokens: int = 200
) -> tuple[Sample, ScriptedEngine]:
    """Run the hook once against a ScriptedEngine served on a free loopback port."""
    from examples.coding_agent.generate import generate

    engine = ScriptedEngine(tokenizer, turns)
    return run_hook(generate, args, engine, sample, max_new_tokens=max_new_tokens), engine


ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"


# ---------------------------------------------------------------- data and grading


def test_every_task_is_gradeable_and_its_reference_passes():
    from examples.coding_agent.reward import tests_of
    from slime.rollout.rm_hub.code import grade_code

    rows = [json.loads(line) for line in (EXAMPLE / "data.jsonl").read_text().splitlines()]
    assert len(rows) == len(REFERENCE)
    for row, solution in zip(rows, REFERENCE, strict=True):
        sample = Sample(label=row["label"], metadata=row.get("metadata") or {})
        tests = tests_of(sample)
        assert grade_code(solution, tests) == (1.0, "passed"), row["prompt"]
        assert grade_code("x = 1", tests)[0] == 0.0, row["prompt"]


# ---------------------------------------------------------------- the hook


def test_run_then_answer_trajectory_is_exact(hook_env):
    """prompt | <code> turn (engine) | <output> (sandbox) | answer turn (engine), token-exact."""
    from examples.coding_agent.reward import reward

    args, tok = hook_env
    sample = _sample(tok, "Write add(a, b) returning a + b.", ADD_TESTS)
    prompt_ids = tok(sample.prompt, add_special_tokens=False)["input_ids"]
    out, engine = _run(
        args,
        tok,
        [
            "Let me check. <code>print(sum(range(5)))</code>",
            "```python\ndef add(a, b):\n    return a + b\n```" + tok.eos_token,
        ],
        sample,
    )

    t1, t2 = (o["output_ids"] for o in engine.outputs)
    obs = "\n<output>\n10\n</output>\n"  # the sandbox really ran it: sum(range(5)) == 10
    obs_ids = tok.encode(obs, add_special_tokens=False)
    assert out.tokens == prompt_ids + t1 + obs_ids + t2
    assert out.response == engine.outputs[0]["text"] + obs + engine.outputs[1]["text"]
    assert out.loss_mask == [1] * len(t1) + [0] * len(obs_ids) + [1] * len(t2)
    assert out.response_length == len(out.loss_mask) == len(out.rollout_log_probs)
    expected_lp = (
        [-0.1 - j / 1000 for j in range(len(t1))] + [0.0] * len(obs_ids) + [-0.2 - j / 1000 for j in range(len(t2))]
    )
    assert out.rollout_log_probs == pytest.approx(expected_lp)
    assert [(t["role"], t["start"], t["end"], t["finish_reason"]) for t in out.metadata["turns"]] == [
        ("model", 0, len(t1), "stop"),
        ("env", len(t1), len(t1) + len(obs_ids), None),
        ("model", len(t1) + len(obs_ids), out.response_length, "stop"),
    ]
    assert out.status == Sample.Status.COMPLETED and out.tokens[-1] == tok.eos_token_id
    assert [r["ok"] for r in out.metadata["tool_runs"]] == [True]

    (b1, h1), (b2, h2) = engine.requests
    assert b1["input_ids"] == prompt_ids and b2["input_ids"] == prompt_ids + t1 + obs_ids
    for body, headers in engine.requests:
        assert "</code>" in body["sampling_params"]["stop"] and body["sampling_params"]["no_stop_trim"] is True
        assert headers["X-SMG-Routing-Key"] == out.session_id

    assert asyncio.run(reward(args, out)) == 1.0 and out.metadata["code_result"] == "passed"


def test_tool_runs_in_the_sandbox_without_network(hook_env):
    """The program runs in the sandbox's scratch directory and cannot reach a server listening on loopback."""
    args, tok = hook_env
    with socket.socket() as listener:  # reachable from here, not from inside the sandbox
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        program = (
            "import os,socket\nprint(os.getcwd())\n"  # short: the context is 256
            f"try:socket.create_connection(('127.0.0.1',{listener.getsockname()[1]}));print('connected')\n"
            "except OSError:print('refused')"
        )
        out, _ = _run(args, tok, [f"<code>{program}</code>", "done" + tok.eos_token], _sample(tok, "t", ADD_TESTS))
    output = out.response.split("<output>")[1].split("</output>")[0].split()
    assert output[0] == "/sandbox" and output[1] == "refused", output


def test_runaway_program_is_killed_and_the_model_is_told(hook_env):
    args, tok = hook_env
    args.sandbox_timeout = 1.0
    out, _ = _run(args, tok, ["<code>while True:\n    pass</code>", "ok" + tok.eos_token], _sample(tok, "t", ADD_TESTS))
    assert out.metadata["tool_runs"][0]["ok"] is False and out.metadata["tool_runs"][0]["wall_s"] < 5
    assert "limit]" in out.response.split("<output>")[1]


def test_max_turns_is_respected(hook_env, monkeypatch):
    """A model that only ever runs code stops after CODING_AGENT_MAX_TURNS model turns, TRUNCATED; the
    program of the last turn is not run (no turn would read its output)."""
    monkeypatch.setenv("CODING_AGENT_MAX_TURNS", "2")
    args, tok = hook_env
    out, engine = _run(args, tok, ["<code>print(6 * 7)</code>"], _sample(tok, "t", ADD_TESTS))
    assert len(engine.requests) == 2 and len(out.metadata["tool_runs"]) == 1
    assert [t["role"] for t in out.metadata["turns"]] == ["model", "env", "model"]
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_turns"
    assert out.response.count("<output>\n42\n</output>") == 1


def test_response_budget_limits_the_output(hook_env):
    """Tool output never pushes the response past max_new_tokens (32, as in the e2e run)."""
    args, tok = hook_env
    out, _ = _run(args, tok, ["<code>print('x' * 500)</code>"], _sample(tok, "t", ADD_TESTS), max_new_tokens=32)
    assert out.response_length == 32 == len(out.loss_mask) == len(out.rollout_log_probs)
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_tokens"


def test_reward_grades_only_what_the_model_wrote(hook_env):
    """A program that prints a correct fenced solution does not earn the reward: tool output is
    not the model's answer (graded on the whole response it would have passed)."""
    from examples.coding_agent.reward import final_program, reward
    from slime.rollout.rm_hub.code import grade_code

    args, tok = hook_env
    printer = 'print("```python\\ndef add(a, b):\\n    return a + b\\n```")'
    out, _ = _run(args, tok, [f"<code>{printer}</code>", "Done." + tok.eos_token], _sample(tok, "t", ADD_TESTS))
    assert "def add(a, b):\n    return a + b" in out.response  # it is there, in the tool output
    assert grade_code(final_program(out.response), ADD_TESTS)[0] == 1.0
    assert asyncio.run(reward(args, out)) == 0.0  # the model's own last program is the printer


def test_reward_falls_back_to_the_last_program_run_and_takes_io_tests(hook_env):
    from examples.coding_agent.reward import reward

    args, tok = hook_env
    io_tests = [{"input": "3\n", "output": "9"}, {"input": "12\n", "output": "144"}]
    out, _ = _run(
        args,
        tok,
        ["<code>n = int(input())\nprint(n * n)</code>", "That works." + tok.eos_token],
        _sample(tok, "Read n, print n * n.", io_tests),
    )
    assert asyncio.run(reward(args, out)) == 1.0  # no fenced block: the program it ran is its answer
    no_code = Sample(response="I do not know.", label=ADD_TESTS)
    assert asyncio.run(reward(args, no_code)) == 0.0 and no_code.metadata["code_result"].startswith("no program")


# ---------------------------------------------------------------- a real run


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_short_training_run_with_sandboxed_tools(ray_cluster, tiny_model_dir, tmp_path):
    """Two real rollouts + train steps with the hook, the real engine and sandbox-graded rewards."""
    from slime.arguments import parse_args
    from slime.train import train

    run_dir = tmp_path / "run"
    args = parse_args(
        train_argv("coding_agent", tiny_model_dir, run_dir, "tests.examples.test_coding_agent.reward_through_hook")
    )
    train(args)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]  # one row per rollout (no eval row: no eval data)
    for r in rows:
        assert math.isfinite(r["rollout/raw_reward"]) and r["rollout/num_samples"] == 8
        assert r["rollout/status/failed"] == 0
        assert math.isfinite(r["train/pg_loss"])
