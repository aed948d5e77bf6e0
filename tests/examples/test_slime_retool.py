"""slime's own retool example (`generate_with_retool.py` with its `tool_sandbox.py`, read from a local
mirror of THUDM/slime, unchanged) trains here: its multi-turn tool-calling generate and its reward
function, against the built-in engine. Its prompt (a system prompt with the tool's JSON schema) is
longer than the bundled tiny model's 256 tokens, so the run uses the same model shape with a
2048-token context. Skipped where the mirror is not on this machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.examples.hook_testing import train_argv
from tests.examples.slime_mirror import extract


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_slime_retool_trains_unchanged(without_shared_ray, task_dir, tmp_path, monkeypatch):
    from slime.arguments import parse_args
    from slime.data.tiny_model import build_tiny_model
    from slime.train import shutdown, train

    example = extract(tmp_path, "examples/retool") / "examples" / "retool"
    model = build_tiny_model(tmp_path / "model", max_position_embeddings=2048)
    monkeypatch.setenv("PYTHONPATH", f"{example}:{Path.cwd()}")  # as slime's launch script sets it
    monkeypatch.syspath_prepend(str(example))  # the start-up checks import the hooks here too
    run_dir = tmp_path / "run"
    argv = train_argv("search_r1", model, run_dir, "generate_with_retool.reward_func")
    argv[argv.index("--prompt-data") + 1] = str(task_dir / "train.jsonl")
    argv[argv.index("--custom-generate-function-path") + 1] = "generate_with_retool.generate"
    argv.remove("--apply-chat-template")
    argv += ["--rollout-max-context-len", "2048"]  # read by the hook (slime's retool script sets it too)
    try:
        train(parse_args(argv))
    finally:
        shutdown()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/status/failed"] == 0 and r["rollout/num_samples"] == 8
        assert math.isfinite(r["rollout/raw_reward"]) and math.isfinite(r["train/pg_loss"])
    logged = json.loads((run_dir / "samples" / "rollout_000000.json").read_text())
    samples = [s for g in logged["groups"] for s in g["samples"]]
    # the hook's own prompt (system prompt + the tool's schema) reached the engine, not the data's
    assert all(s["prompt_length"] > 256 and s["response_length"] > 0 for s in samples)
