"""slime's own multi-agent example (`examples.multi_agent.rollout_with_multi_agents`, its agent
system and prompts, unchanged) trains here with `--rm-type deepscaler`, as slime's launch script
runs it. Its prompts are longer than the bundled tiny model's 256 tokens: the same model shape
with a 2048-token context."""

from __future__ import annotations

import pytest

from tests.examples.slime_mirror import extract, train_from_tree


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_slime_multi_agent_example_trains_unchanged(task_dir, tmp_path):
    from slime.data.tiny_model import build_tiny_model

    tree = extract(tmp_path, "examples")
    model = build_tiny_model(tmp_path / "model", max_position_embeddings=2048)
    argv = [
        "--hf-checkpoint", str(model), "--prompt-data", str(task_dir / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "deepscaler",
        "--custom-generate-function-path", "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents",
        "--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-context-len", "2048", "--rollout-max-response-len", "8",
        "--global-batch-size", "4", "--micro-batch-size", "4", "--colocate",
    ]  # fmt: skip
    rows = train_from_tree(tree, argv, tmp_path / "run")
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        # the example's agent system: 5 parallel solvers for each of the 2 x 2 samples
        assert r["rollout/num_samples"] == 20 and r["rollout/status/failed"] == 0
