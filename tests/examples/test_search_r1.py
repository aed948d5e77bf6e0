"""The Search-R1 example: BM25 server, the multi-turn hook's exact trajectory, the reward, a real run.

The hook tests drive `generate` against a scripted stand-in for the engine's `/generate` (the
only fake here: a random tiny model would almost never write `<search>`), with the real
retrieval server running as its own process. The e2e test is a real short training run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slime.utils.types import Sample
from tests.examples.hook_testing import ScriptedEngine, run_hook, train_argv

pytestmark = pytest.mark.usefixtures("fresh_generate_state")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "search_r1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def start_retrieval_server(port: int) -> subprocess.Popen:
    """`python -m examples.search_r1.retrieval_server --port N`, as examples/search_r1/README.md runs it; waits for /health."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.search_r1.retrieval_server", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"retrieval server exited: {proc.stdout.read().decode()}")
        try:
            if _get_json(f"http://127.0.0.1:{port}/health")["status"] == "ok":
                return proc
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("retrieval server did not come up in 30 s")


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def retrieval_url() -> Iterator[str]:
    port = _free_port()
    proc = start_retrieval_server(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def reward_through_hook(args: Namespace, sample: Sample) -> float:
    """The example's reward, after checking the sample really came through the hook's multi-turn
    driver with the retrieval URL in its environment (used by the e2e run: raising here marks the
    sample FAILED, which the test rules out; the random model itself will hardly ever search)."""
    from examples.search_r1.reward import reward

    turns = sample.metadata.get("turns")
    if not turns or turns[0]["role"] != "model" or len(sample.loss_mask) != sample.response_length:
        raise AssertionError(f"sample {sample.index} did not come through run_multi_turn: {turns}")
    if "SEARCH_R1_URL" not in os.environ:  # examples/search_r1/README.md's claim: the rollout process inherits it
        raise AssertionError("SEARCH_R1_URL did not reach the rollout process")
    return await reward(args, sample)


@pytest.fixture
def hook_env(tiny_model_dir, tmp_path, retrieval_url, monkeypatch) -> tuple[Namespace, Any]:
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    monkeypatch.setenv("SEARCH_R1_URL", retrieval_url)
    args = parse_args(train_argv("search_r1", tiny_model_dir, tmp_path / "run"))
    return args, GenerateState(args).tokenizer


def _sample(tokenizer: Any, question: str, label: str) -> Sample:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return Sample(index=0, prompt=prompt, label=label)


def _run(args: Namespace, tokenizer: Any, turns: list[str], sample: Sample) -> tuple[Sample, ScriptedEngine]:
    from examples.search_r1.generate import generate

    engine = ScriptedEngine(tokenizer, turns, weight_version="7")
    # room for two searches; the e2e run uses the CLI's 32
    return run_hook(generate, args, engine, sample, max_new_tokens=200), engine


def _health(url: str) -> dict[str, Any]:
    return _get_json(f"{url}/health")


# ---------------------------------------------------------------- retrieval


def test_bm25_puts_the_answer_passage_first_for_every_question():
    from examples.search_r1.retrieval_server import DEFAULT_CORPUS, BM25Index, load_corpus

    index = BM25Index(load_corpus(DEFAULT_CORPUS))
    for line in (EXAMPLE / "data.jsonl").read_text().splitlines():
        row = json.loads(line)
        question = row["prompt"].split("Question:", 1)[1]
        top = index.search(question, 1)
        assert top and row["label"].lower() in top[0]["text"].lower(), (question, top)
    assert index.search("the of and", 3) == [] and index.search("zebra", 3) == []


def test_retrieval_server_answers_over_http(retrieval_url):
    before = _health(retrieval_url)["requests"]
    result = _get_json(f"{retrieval_url}/retrieve", {"queries": ["red planet", "capital of Japan"], "topk": 2})
    assert [r[0]["title"] for r in result["result"]] == ["Mars", "Japan"]
    assert len(result["result"][0]) == 2 and result["result"][0][0]["score"] > result["result"][0][1]["score"]
    assert _health(retrieval_url) == {"status": "ok", "num_docs": 32, "requests": before + 1}
    with pytest.raises(urllib.error.HTTPError) as e:
        _get_json(f"{retrieval_url}/retrieve", {"queries": "not a list"})
    assert e.value.code == 400


# ---------------------------------------------------------------- the hook


def test_search_then_answer_trajectory_is_exact(hook_env, retrieval_url):
    """prompt | search turn (engine) | <information> (server) | answer turn (engine), token-exact."""
    from examples.search_r1.reward import reward

    args, tok = hook_env
    sample = _sample(tok, "Which planet is called the Red Planet?", "Mars")
    prompt_ids = tok(sample.prompt, add_special_tokens=False)["input_ids"]
    calls_before = _health(retrieval_url)["requests"]
    out, engine = _run(args, tok, ["I should look it up. <search>red planet</search>", "<answer>Mars</answer>"], sample)

    assert _health(retrieval_url)["requests"] == calls_before + 1  # the real server was asked once
    t1, t2 = (o["output_ids"] for o in engine.outputs)
    info = (
        "\n<information>(1) Mars: Mars is called the Red Planet because iron oxide dust makes its surface "
        "look red.</information>\n"
    )
    info_ids = tok.encode(info, add_special_tokens=False)
    assert out.tokens == prompt_ids + t1 + info_ids + t2
    assert out.response == engine.outputs[0]["text"] + info + engine.outputs[1]["text"]
    assert out.response_length == len(t1) + len(info_ids) + len(t2) == len(out.loss_mask)
    assert out.loss_mask == [1] * len(t1) + [0] * len(info_ids) + [1] * len(t2)
    expected_lp = (
        [-0.1 - j / 1000 for j in range(len(t1))] + [0.0] * len(info_ids) + [-0.2 - j / 1000 for j in range(len(t2))]
    )
    assert out.rollout_log_probs == pytest.approx(expected_lp)
    assert [(t["role"], t["start"], t["end"], t["finish_reason"]) for t in out.metadata["turns"]] == [
        ("model", 0, len(t1), "stop"),
        ("env", len(t1), len(t1) + len(info_ids), None),
        ("model", len(t1) + len(info_ids), out.response_length, "stop"),
    ]
    assert out.status == Sample.Status.COMPLETED and out.metadata["stop_reason"] == "env_done"
    assert out.metadata["search_queries"] == ["red planet"] and out.weight_versions == ["7", "7"]

    # Each turn: the whole sequence so far, the stop strings, the trajectory's routing key.
    (b1, h1), (b2, h2) = engine.requests
    assert b1["input_ids"] == prompt_ids and b2["input_ids"] == prompt_ids + t1 + info_ids
    for body, headers in engine.requests:
        assert {"</search>", "</answer>"} <= set(body["sampling_params"]["stop"])
        assert body["sampling_params"]["no_stop_trim"] is True and body["return_logprob"] is True
        assert headers["X-SMG-Routing-Key"] == out.session_id
    assert b2["sampling_params"]["max_new_tokens"] == 200 - len(t1) - len(info_ids)

    assert asyncio.run(reward(args, out)) == 1.0


def test_max_turns_is_respected(hook_env, retrieval_url, monkeypatch):
    """A model that only ever searches stops after SEARCH_R1_MAX_TURNS model turns, TRUNCATED; the
    search after the last turn is not run (no turn would read it)."""
    monkeypatch.setenv("SEARCH_R1_MAX_TURNS", "2")
    args, tok = hook_env
    calls_before = _health(retrieval_url)["requests"]
    out, engine = _run(args, tok, ["<search>capital of Japan</search>"], _sample(tok, "Capital of Japan?", "Tokyo"))
    assert len(engine.requests) == 2
    assert [t["role"] for t in out.metadata["turns"]] == ["model", "env", "model"]
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_turns"
    assert _health(retrieval_url)["requests"] == calls_before + 1
    assert "Tokyo is the capital city of Japan." in out.response
    assert len(out.tokens) - len(out.loss_mask) == out.prompt_length


def test_turn_without_a_tag_ends_the_trajectory(hook_env):
    from examples.search_r1.reward import reward

    args, tok = hook_env
    out, engine = _run(args, tok, ["I think it is Mars." + tok.eos_token], _sample(tok, "Red Planet?", "Mars"))
    assert len(engine.requests) == 1 and out.loss_mask == [1] * out.response_length
    assert out.tokens[-1] == tok.eos_token_id and out.status == Sample.Status.COMPLETED
    assert asyncio.run(reward(args, out)) == 0.0  # no <answer> tag: no credit


def test_response_budget_limits_the_observation(hook_env):
    """The information appended never pushes the response past max_new_tokens."""
    from examples.search_r1.generate import generate

    args, tok = hook_env
    engine = ScriptedEngine(tok, ["<search>red planet</search>"])
    # the CLI's max_new_tokens 32, as in the e2e run
    out = run_hook(generate, args, engine, _sample(tok, "Red Planet?", "Mars"))
    assert out.response_length == 32 == len(out.loss_mask) == len(out.rollout_log_probs)
    assert out.status == Sample.Status.TRUNCATED and out.metadata["stop_reason"] == "max_tokens"


def test_dead_retrieval_server_fails_loudly(hook_env, monkeypatch):
    from slime.utils.http_utils import HTTPRequestError

    monkeypatch.setenv("SEARCH_R1_URL", f"http://127.0.0.1:{_free_port()}")
    args, tok = hook_env
    with pytest.raises(HTTPRequestError):
        _run(args, tok, ["<search>red planet</search>"], _sample(tok, "Red Planet?", "Mars"))


def test_exact_match_reward_normalises():
    from examples.search_r1.reward import exact_match

    assert exact_match("<answer> The  Mars. </answer>", "Mars") == 1.0
    assert exact_match("<answer>Venus</answer> then <answer>mars</answer>", "Mars") == 1.0  # the last one
    assert exact_match("<answer>Leonardo</answer>", "Leonardo da Vinci") == 0.0
    assert exact_match("<answer>da Vinci</answer>", "Leonardo da Vinci|da Vinci") == 1.0
    assert exact_match("Mars", "Mars") == 0.0 and exact_match("<answer></answer>", "") == 0.0


# ---------------------------------------------------------------- a real run


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_short_training_run_with_retrieval_server(without_shared_ray, tiny_model_dir, tmp_path, monkeypatch):
    """Two real rollouts + train steps with the hook, the real engine and the real retrieval server.
    The server's URL reaches the hook through the Ray workers' environment, inherited from the
    cluster's start: this run starts (and stops) a cluster of its own."""
    from slime.arguments import parse_args
    from slime.train import shutdown, train

    port = _free_port()
    server = start_retrieval_server(port)
    monkeypatch.setenv("SEARCH_R1_URL", f"http://127.0.0.1:{port}")  # Ray workers inherit it
    run_dir = tmp_path / "run"
    try:
        args = parse_args(
            train_argv("search_r1", tiny_model_dir, run_dir, "tests.examples.test_search_r1.reward_through_hook")
        )
        train(args)
    finally:
        shutdown()
        stop_process(server)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]  # one row per rollout (no eval row: no eval data)
    for r in rows:
        assert math.isfinite(r["rollout/raw_reward"]) and r["rollout/num_samples"] == 8
        assert r["rollout/status/failed"] == 0
        assert math.isfinite(r["train/pg_loss"])
