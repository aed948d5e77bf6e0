"""`--train-backend megatron` through Ray: runs whose trainer is megatron-core (two tensor-parallel
ranks colocated with the built-in engine, with PPO's critic, and on their own cores beside it; one
rank resuming), real
weight syncs (the engine's log-probs equal the trainer's after each) and a reward that varies, so
the policy moves; unsupported options stop before Ray starts."""

from __future__ import annotations

import json

import pytest

from slime.errors import SlimeError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]
pytest.importorskip("megatron.core")


def _argv(tiny_model_dir, task_dir, run_dir, *extra):
    from tests.helpers import short_run_argv

    return short_run_argv(
        tiny_model_dir,
        task_dir,
        run_dir,
        *("--train-backend", "megatron", "--check-weight-update-equal"),  # colocated: --offload-train on
        *("--custom-rm-path", "tests.e2e.hooks.digit_reward", "--rollout-temperature", "1.0"),
        *extra,
    )


TP2 = ("--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2")
TP2_COLOCATED = (*TP2, "--rollout-num-gpus-per-engine", "2")
# (one rank runs in test_a_megatron_run_saves_and_resumes's second run)
LAYOUTS = {
    "tp2_colocated_ppo": (*TP2_COLOCATED, "--advantage-estimator", "ppo"),
    "tp2_separate": (*TP2, "--rollout-num-gpus", "1"),  # --colocate dropped below
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_megatron_run_trains_and_syncs_the_engine(tiny_model_dir, task_dir, tmp_path, layout):
    from slime.arguments import parse_args
    from slime.train import train

    run_dir = tmp_path / "run"
    argv = _argv(tiny_model_dir, task_dir, run_dir, *LAYOUTS[layout])
    if layout.endswith("separate"):
        argv.remove("--colocate")
    args = parse_args(argv)
    assert args.data_parallel_size == 1 and args.colocate != layout.endswith("separate")
    train(args)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and not any(r.get("rollout/status/failed") for r in rows)
    for r in rows:
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-5  # the engine serves the Megatron policy's weights
        assert r["perf/weight_sync_bytes"] > 0
        if args.colocate:  # --offload-train: Adam's state out of memory while the engine generates
            assert r["perf/train_offload_bytes"] > 0
    assert any(r["train/grad_norm"] > 0 for r in rows)  # the reward varied: the policy moved
    if args.use_critic:  # PPO: the critic's values fed GAE and it trained beside the policy
        assert all(r["train/value_loss"] > 0 and r["train/critic_grad_norm"] > 0 for r in rows)


def test_what_the_megatron_backend_cannot_do_yet_stops_before_the_run(tiny_model_dir, task_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.train import train

    args = parse_args(
        _argv(tiny_model_dir, task_dir, tmp_path / "run", "--enable-lora", "--pipeline-model-parallel-size", "2")
    )
    with pytest.raises(SlimeError, match=r"--train-backend megatron does not support --pipeline-model-parallel-size 2"):
        train(args)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_megatron_run_saves_and_resumes(tiny_model_dir, task_dir, tmp_path):
    """--save-interval writes Megatron checkpoints through a run on 2 tensor-parallel ranks; a second
    run on one rank with --load starts after the last one and trains on."""
    from slime.arguments import parse_args
    from slime.train import train

    save = str(tmp_path / "ckpt")
    first = _argv(tiny_model_dir, task_dir, tmp_path / "run1", "--save", save, "--save-interval", "1", *TP2_COLOCATED)
    train(parse_args(first))
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (tmp_path / "ckpt" / "iter_0000001" / ".metadata").is_file()
    second = _argv(tiny_model_dir, task_dir, tmp_path / "run2", "--load", save, "--num-rollout", "3")
    train(parse_args(second))
    ids = [[json.loads(line)["rollout_id"] for line in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
           for r in ("run1", "run2")]  # fmt: skip
    assert len(ids[0]) == 2 and ids[1] == [ids[0][-1] + 1]  # the third rollout only
