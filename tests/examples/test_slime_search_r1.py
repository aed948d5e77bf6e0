"""slime's own search-r1 example (`generate_with_search.py`, `qa_em_format.py`, `local_search_server.py`,
read from a local mirror of THUDM/slime, unchanged) against this repository's retrieval server on the
URL the example hard-codes (127.0.0.1:8000), with labels that are JSON objects as Search-R1's data
has them (`{"ground_truth": {"target": [...]}}`). Skipped where the mirror is not on this machine
or port 8000 is taken."""

from __future__ import annotations

import importlib
import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slime.utils.types import Sample
from tests.examples.hook_testing import ScriptedEngine, run_hook, train_argv
from tests.examples.test_search_r1 import start_retrieval_server, stop_process

pytestmark = pytest.mark.usefixtures("fresh_generate_state")

MIRROR = Path("/work/.mirror/THUDM+slime/repo")
PORT = 8000  # SEARCH_R1_CONFIGS["local"]["search_url"] in slime's generate_with_search.py
QUESTIONS = [("Which planet is called the Red Planet?", ["Mars"]), ("What is the capital of Japan?", ["Tokyo"])]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def slime_search_r1(tmp_path_factory) -> Iterator[Path]:
    """slime's example directory, first on sys.path as its launch script puts it, with the
    retrieval server on the port the example calls."""
    if not MIRROR.exists():
        pytest.skip("no local mirror of THUDM/slime")
    if not _port_free(PORT):
        pytest.skip(f"port {PORT} (the example's search URL) is taken")
    dest = tmp_path_factory.mktemp("slime_search_r1")
    archive = subprocess.run(
        ["git", "-C", str(MIRROR), "archive", "HEAD", "examples/search-r1"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    example = dest / "examples" / "search-r1"
    server = start_retrieval_server(PORT)
    sys.path.insert(0, str(example))
    try:
        yield example
    finally:
        sys.path.remove(str(example))
        for name in ("generate_with_search", "qa_em_format", "local_search_server"):
            sys.modules.pop(name, None)
        stop_process(server)


def _data(tmp_path: Path) -> Path:
    """Search-R1's data shape: the label under `reward_model` is an object, not a string."""
    path = tmp_path / "train.jsonl"
    rows = [
        {
            # Search-R1's prompts name the tags (its answer extraction counts on the template's
            # <answer> pair); short, for the tiny model's context must hold two turns and the retry text
            "prompt": f"Search <search>q</search>, answer <answer>a</answer>. {q}",
            "reward_model": {"ground_truth": {"target": targets}, "style": "rule"},
        }
        for q, targets in QUESTIONS * 4
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_slime_search_r1_hook_and_reward_run_unchanged(slime_search_r1, tiny_model_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.data.dataset import load_prompt_samples
    from slime.rollout.sglang_rollout import GenerateState

    gen = importlib.import_module("generate_with_search")
    argv = train_argv("search_r1", tiny_model_dir, tmp_path / "run")
    argv[argv.index("--prompt-data") + 1] = str(_data(tmp_path))
    argv[argv.index("--label-key") + 1] = "reward_model"
    args = parse_args(argv)
    samples = load_prompt_samples(args.prompt_data, input_key="prompt", label_key="reward_model")
    assert samples[0].label == {"ground_truth": {"target": ["Mars"]}, "style": "rule"}

    tokenizer = GenerateState(args).tokenizer
    engine = ScriptedEngine(tokenizer, ["<search>red planet</search>", "<answer>Mars</answer>"])
    sample = run_hook(gen.generate, args, engine, samples[0], max_new_tokens=64)
    assert sample.status == Sample.Status.COMPLETED
    observation = sample.response.split("<information>")[1]
    assert observation.startswith('Doc 1(Title: "Mars")')  # our server's passage, through slime's client
    assert len(engine.requests) == 2 and engine.requests[0][0]["return_logprob"] is True
    assert sum(sample.loss_mask) == len(engine.outputs[0]["output_ids"]) + len(engine.outputs[1]["output_ids"])
    import asyncio

    assert asyncio.run(gen.reward_func(args, sample)) == 1.0
    wrong = Sample(index=1, prompt=sample.prompt, response=sample.response.replace("Mars</answer>", "Venus</answer>"))
    wrong.label = {"ground_truth": {"target": ["Mars"]}}
    assert asyncio.run(gen.reward_func(args, wrong)) == 0  # exact match: a wrong answer earns nothing


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_slime_search_r1_trains_on_object_labels(
    slime_search_r1, without_shared_ray, tiny_model_dir, tmp_path, monkeypatch
):
    """Two real rollouts and train steps with slime's generate and reward functions, the built-in
    engine and the retrieval server; the hook modules import in Ray's workers through PYTHONPATH,
    as slime's launch script sets it."""
    from slime.arguments import parse_args
    from slime.train import shutdown, train

    monkeypatch.setenv("PYTHONPATH", f"{slime_search_r1}:{Path.cwd()}")
    run_dir = tmp_path / "run"
    argv = train_argv("search_r1", tiny_model_dir, run_dir, "generate_with_search.reward_func")
    argv[argv.index("--prompt-data") + 1] = str(_data(tmp_path))
    argv[argv.index("--label-key") + 1] = "reward_model"
    argv[argv.index("--custom-generate-function-path") + 1] = "generate_with_search.generate"
    argv.remove("--apply-chat-template")
    # the tiny model's context is 256 tokens: the prompt (~65), two turns of 16 and the hook's
    # retry text (~150) must fit, or the engine refuses the second turn and the sample FAILs
    argv[argv.index("--rollout-max-response-len") + 1] = "16"
    try:
        train(parse_args(argv))
    finally:
        shutdown()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/status/failed"] == 0 and r["rollout/num_samples"] == 8
        assert math.isfinite(r["rollout/raw_reward"]) and math.isfinite(r["train/pg_loss"])
