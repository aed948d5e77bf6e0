"""Trainer -> engine weight sync: after a sync the engine scores a fixed sequence exactly like the trainer."""

import pytest
import torch

from slime.arguments import parse_args
from slime.sync.syncer import CollectiveSyncer, SharedMemorySyncer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from slime.ray.engine_process import EngineProcess

    proc = EngineProcess.start(str(tiny_model_dir), num_threads=1)
    try:
        proc.wait_until_healthy(timeout=120)
        yield proc
    finally:
        proc.stop()


def _actor(tiny_model_dir, tmp_path, *extra):
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "1",
            "--micro-batch-size",
            "4",
            "--lr",
            "1e-2",
            "--run-dir",
            str(tmp_path),
            *extra,
            "--lr-decay-style",
            "constant",  # several train() calls on a one-rollout schedule: no decay to 0
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    assert actor.init() == 0
    return actor


def test_logprob_parity_after_sync(engine, tiny_model_dir, tmp_path):
    """Colocated on the CPU (the default nccl transport): through the shared-memory buffer."""
    actor = _actor(tiny_model_dir, tmp_path, "--colocate")
    assert actor.weight_sync_path(actor.full_state_dict()) == "shm"
    seq = list(range(5, 40))
    assert actor.check_weight_parity(engine.url, seq) < 1e-4  # same checkpoint on both sides

    # One real optimizer step on a made-up batch moves the trainer's weights away from the engine's.
    data = {
        "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17]],
        "response_lengths": [2, 2, 2, 2],
        "loss_masks": [[1, 1]] * 4,
        "rewards": [1.0, -1.0, 0.5, -0.5],
    }
    metrics = actor.train(0, data)
    assert metrics["train/grad_norm"] > 0
    stale = actor.check_weight_parity(engine.url, seq)
    assert stale > 1e-3, "training should have changed the log-probs"

    metrics = actor.update_weights([engine.url], weight_version="1")
    assert metrics["perf/update_weights_time"] > 0 and metrics["perf/weight_sync_bytes"] > 0
    assert isinstance(actor.syncer, SharedMemorySyncer)  # the shared-memory buffer, no collective group
    assert actor.check_weight_parity(engine.url, seq) < 1e-4

    # And the engine's own generation log-probs now come from the new weights.
    from slime.engine.client import EngineClient

    out = EngineClient(engine.url).generate(
        {"input_ids": seq[:10], "sampling_params": {"temperature": 0.0, "max_new_tokens": 6}, "return_logprob": True}
    )
    full = seq[:10] + out["output_ids"]
    engine_lp = torch.tensor([lp[0] for lp in out["meta_info"]["output_token_logprobs"]])
    data = {"tokens": [full], "response_lengths": [len(out["output_ids"])], "loss_masks": [[1] * 6]}
    trainer_lp = torch.cat(actor._forward_only(data, [0], actor.model))
    assert (engine_lp - trainer_lp).abs().mean() < 1e-4
    path = actor.syncer.shm.path
    actor.syncer.close()
    import os

    assert not os.path.exists(path)


def test_distributed_update_serves_the_trainers_new_weights(engine, tiny_model_dir, tmp_path):
    """--update-weight-transport nccl: a gloo broadcast; the engine then generates exactly what a
    direct HF forward with the trainer's new weights gives."""
    from slime.engine.client import EngineClient

    actor = _actor(
        tiny_model_dir, tmp_path, "--update-weight-transport", "nccl", "--update-weight-buffer-size", "30000"
    )
    assert actor.weight_sync_path(actor.full_state_dict()) == "collective"  # not colocated
    seq = list(range(5, 40))
    data = {
        "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17]],
        "response_lengths": [2, 2, 2, 2],
        "loss_masks": [[1, 1]] * 4,
        "rewards": [-1.0, 1.0, -0.5, 0.5],
    }
    for step in range(2):  # the second sync reuses the group
        actor.train(step, data)
        assert actor.check_weight_parity(engine.url, seq) > 1e-3, "training should have changed the log-probs"
        actor.update_weights([engine.url], weight_version=f"d{step}")
        assert actor.check_weight_parity(engine.url, seq) < 1e-4
    client = EngineClient(engine.url)
    assert client.get_model_info()["weight_version"] == "d1"
    model = actor.model.eval()
    ids = list(seq[:8])
    out = client.generate(
        {
            "input_ids": ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True},
            "return_logprob": True,
        }
    )
    want = []
    with torch.no_grad():
        for _ in range(6):
            t = int(model(input_ids=torch.tensor([ids + want])).logits[0, -1].argmax())
            want.append(t)
    assert out["output_ids"] == want
    assert isinstance(actor.syncer, CollectiveSyncer)
    actor.syncer.close()
