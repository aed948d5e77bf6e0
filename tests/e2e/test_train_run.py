"""A real short run: Ray actors, an engine server process, the trainer, weight sync, checkpoints."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in model_dir.glob("*.safetensors"):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def short_run(tiny_model_dir, task_dir, tmp_path_factory):
    from slime.arguments import parse_args
    from slime.train import finish_run, train

    run_dir = tmp_path_factory.mktemp("run")
    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--custom-rm-path",
        "tests.e2e.hooks.digit_reward",
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "32",
        "--micro-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--colocate",
        "--check-weight-update-equal",
        "--use-tensorboard",
        "--eval-interval",  # slime evaluates on an interval only
        "3",
        "--eval-prompt-data",
        "arith",
        str(task_dir / "eval.jsonl"),
        "--eval-temperature",
        "0",
        "--run-dir",
        str(run_dir),
        "--save-interval",
        "2",
    ]
    args = parse_args(argv)
    last = train(args)
    finish_run(args)
    return args, run_dir, last


def test_metrics_are_written_with_slime_keys(short_run):
    args, run_dir, last = short_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3]  # eval before training, then one row per rollout
    assert "eval/arith" in rows[0] and "eval/arith" in rows[-1]
    for r in rows[1:]:
        for key in (
            "rollout/raw_reward",
            "rollout/response_len/mean",
            "train/pg_loss",
            "train/pg_clipfrac",
            "train/ppo_kl",
            "train/entropy_loss",
            "train/grad_norm",
            "train/lr",
            "rollout/advantages",
            "perf/rollout_time",
            "perf/train_time",
            "perf/update_weights_time",
            "perf/tokens_per_s",
        ):
            assert key in r and r[key] is not None and math.isfinite(r[key]), key
        assert r["rollout/num_samples"] == 32
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert list((run_dir / "tensorboard").glob("events.out.tfevents*"))
    assert json.loads((run_dir / "args.json").read_text())["rollout_batch_size"] == 8


def test_first_step_is_on_policy(short_run):
    """Old log-probs are recomputed with the very weights being trained: ratio 1, nothing clipped."""
    _, run_dir, _ = short_run
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[1])
    assert first["train/ppo_kl"] == 0.0 and first["train/pg_clipfrac"] == 0.0
    # The engine sampled with the same weights the trainer holds: log-probs agree.
    assert first["train/train_rollout_logprob_abs_diff"] < 1e-4


def test_weight_sync_keeps_engine_and_trainer_equal(short_run):
    _, run_dir, _ = short_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()[1:]]
    for r in rows:
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-4


def test_checkpoints_are_hf_loadable_and_weights_changed(short_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args, run_dir, _ = short_run
    save = Path(args.save)
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000001", "iter_0000002"]
    final = save / "iter_0000002"
    model = AutoModelForCausalLM.from_pretrained(final)
    tok = AutoTokenizer.from_pretrained(final)
    assert tok("1+2=")["input_ids"] == AutoTokenizer.from_pretrained(tiny_model_dir)("1+2=")["input_ids"]
    before, after = _weights(tiny_model_dir), _weights(final)
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))}"
    assert model.config.vocab_size == len(tok)
    assert (final / "trainer_state.pt").exists() and (final / "rollout_state.json").exists()


def test_a_run_in_a_shared_cluster_leaves_it_as_it_found_it(short_run):
    """The run found Ray up (the session's cluster) and released only what it made: the cluster is
    still up, every CPU free again, its placement group removed, no engine or router process left."""
    import os
    import time

    import ray
    from ray.util import placement_group_table

    from slime.train import shutdown
    from tests.helpers import descendants

    shutdown()  # what `slime train` calls at the end: not this run's cluster, so it stays
    assert ray.is_initialized()
    deadline = time.time() + 30
    while True:
        free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
        groups = [g["state"] for g in placement_group_table().values() if g["state"] != "REMOVED"]
        cmdlines = []
        for pid in descendants(os.getpid()):
            try:
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
        serving = [
            c for c in cmdlines if any(m in c for m in ("slime.engine.server", "slime.ray.dispatcher", "sglang_router"))
        ]
        if (free == total and not groups and not serving) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert free == total and total > 0, (free, total)
    assert not groups and not serving, (groups, serving)
