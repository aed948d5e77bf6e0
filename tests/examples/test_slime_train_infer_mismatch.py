"""slime's own train-inference mismatch example (`mis.py` and `mis.yaml`, unchanged) trains here:
`--custom-tis-function-path examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp`
with its `--custom-config-path`, as slime's launch script passes them."""

from __future__ import annotations

import math

import pytest

from tests.examples.slime_mirror import extract, train_from_tree


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_slime_mis_example_trains_unchanged(tiny_model_dir, task_dir, tmp_path):
    tree = extract(tmp_path, "examples")
    argv = [
        "--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(task_dir / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--rm-type", "math",
        "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "8", "--global-batch-size", "8", "--micro-batch-size", "4",
        "--use-tis", "--use-kl-loss",
        "--custom-config-path", "examples/train_infer_mismatch_helper/mis.yaml",
        "--custom-tis-function-path", "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp",
        "--colocate",
    ]  # fmt: skip
    rows = train_from_tree(tree, argv, tmp_path / "run")
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/status/failed"] == 0 and math.isfinite(r["train/pg_loss"])
        # the example's own statistics (its truncation and rejection steps, per mis.yaml)
        for key in ("train/mis_tis_weight_after_bound", "train/mis_rs_mask_fraction_low", "train/mis_kl"):
            assert math.isfinite(r[key]), key
        assert r["train/mis_tis_weight_after_bound"] <= 2.0 + 1e-6  # mis.yaml's tis_upper_bound
