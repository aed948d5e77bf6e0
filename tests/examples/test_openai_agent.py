"""examples/openai_agent end to end, short: the unmodified OpenAI-SDK calculator agent trained
through `--custom-generate-function-path slime.agent.generate.generate --agent-function-path
examples.openai_agent.agent.run` (Ray, the engine behind its run key, the adapter, the trainer).
The tiny random model will not call the tool; what is checked is the path: every sample came out
of an adapter session with exact masks, and the run trained on them. The numbers in
examples/openai_agent/README.md and docs/agents.md are from examples/openai_agent/run.sh."""

from __future__ import annotations

import json
import math

import pytest

from slime.utils.types import Sample


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_agent_training_run(ray_cluster, tiny_model_dir, tmp_path):
    from examples.openai_agent.agent import COPIED_CALL
    from examples.openai_agent.make_data import write
    from slime.arguments import parse_args
    from slime.observability.debug_data import read_samples
    from slime.rollout.sglang_rollout import GenerateState
    from slime.train import train

    data, run_dir = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    write(data, difficulty=1)
    GenerateState.reset()
    try:
        args = parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--prompt-data",
                str(data / "train.jsonl"),
                "--input-key",
                "prompt",
                "--label-key",
                "label",
                "--rm-type",
                "math",
                "--custom-generate-function-path",
                "slime.agent.generate.generate",
                "--agent-function-path",
                "examples.openai_agent.agent.run",
                "--sglang-tool-call-parser",
                "qwen25",
                "--max-turns",
                "3",
                "--max-total-tokens",
                "200",
                "--num-rollout",
                "2",
                "--rollout-batch-size",
                "4",
                "--n-samples-per-prompt",
                "2",
                "--rollout-max-response-len",
                "16",
                "--global-batch-size",
                "8",
                "--micro-batch-size",
                "4",
                "--advantage-estimator",
                "grpo",
                "--colocate",
                "--run-dir",
                str(run_dir),
                "--save-debug-rollout-data",
                str(tmp_path / "rollout_{rollout_id}.pt"),
            ]
        )
        train(args)
    finally:
        GenerateState.reset()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/status/failed"] == 0 and r["rollout/num_samples"] >= 8
        assert math.isfinite(r["train/pg_loss"])
    samples = read_samples(tmp_path / "rollout_0.pt", 0)
    assert samples
    for s in samples:
        assert isinstance(s, Sample) and s.session_id.startswith("agent-")
        assert s.metadata["turns"][0]["role"] == "model" and len(s.loss_mask) == s.response_length
        model_tokens = sum(t["end"] - t["start"] for t in s.metadata["turns"] if t["role"] == "model")
        assert sum(s.loss_mask) == model_tokens and s.reward in (0.0, COPIED_CALL, 1.0)
