"""Checkpoints of the megatron backend: Megatron's torch_dist (model and optimizer) beside the Hugging
Face files. Resuming a PPO run (policy and critic) gives the uninterrupted run's next rollout
exactly, at the tensor-parallel size it was saved with and at another; the HF files load in transformers; a checkpoint of the other
backend is refused with what to do."""

from __future__ import annotations

import os

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import commit, iter_dir
from slime.utils.net import free_port
from tests.backends.test_megatron_actor import DATA, _argv, _copy
from tests.helpers import run_ranks

pytest.importorskip("megatron.core")

PPO = ("--advantage-estimator", "ppo", "--critic-lr-warmup-iters", "1")  # the critic's state resumes too


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, tp: int, phase: str) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainActor

    os.environ["OMP_NUM_THREADS"] = "1"
    save = f"{out}/ckpt"
    layout = ("--actor-num-gpus-per-node", str(world), "--tensor-model-parallel-size", str(tp))
    extra = ("--train-backend", "megatron", "--save", save, "--save-hf", f"{out}/hf_{{rollout_id}}", *PPO)
    if phase != "uninterrupted":
        extra = (*extra, "--load", save)
    args = parse_args(_argv(model_dir, f"{out}/run_{phase}", *layout, *extra))
    actor = MegatronTrainActor(
        args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, num_threads=1
    )
    start = actor.init()
    result: dict = {"start": start}
    if phase == "uninterrupted":
        actor.train(0, _copy(DATA))
        actor.save(0)
        result["saved_state"] = actor.full_state_dict()
        if rank == 0:
            commit(save, 0)
    result["metrics"] = actor.train(1, _copy(DATA))
    result["state"] = actor.full_state_dict()
    if rank == 0:
        torch.save(result, f"{out}/{phase}.pt")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron-ckpt")
    for phase, world, tp in (("uninterrupted", 2, 2), ("resumed_tp2", 2, 2), ("resumed_tp1", 1, 1)):
        run_ranks(_worker, world, free_port(), str(tiny_model_dir), str(out), tp, phase)
    loaded = {p.stem: torch.load(p, weights_only=False) for p in out.glob("*.pt")}
    return out, loaded


def test_resuming_continues_the_run_exactly(runs):
    _, got = runs
    whole = got["uninterrupted"]
    for phase, tol in (("resumed_tp2", 0.0), ("resumed_tp1", 1e-5)):  # another TP size: another summation order
        resumed = got[phase]
        assert resumed["start"] == 1
        for key in ("train/pg_loss", "train/grad_norm", "train/lr", "train/value_loss", "train/critic_grad_norm",
                    "train/critic_lr"):  # fmt: skip
            assert resumed["metrics"][key] == pytest.approx(whole["metrics"][key], rel=tol, abs=tol), (phase, key)
        for k, v in whole["state"].items():
            torch.testing.assert_close(
                resumed["state"][k], v, rtol=0, atol=tol, msg=lambda m, k=k, p=phase: f"{p} {k}: {m}"
            )


def test_the_checkpoint_is_megatrons_torch_dist_and_a_transformers_model(runs):
    from transformers import AutoModelForCausalLM

    out, got = runs
    ckpt = iter_dir(out / "ckpt", 0)
    assert (ckpt / ".metadata").is_file() and list(ckpt.glob("*.distcp"))  # Megatron's torch_dist
    saved = got["uninterrupted"]["saved_state"]
    for directory in (ckpt, out / "hf_0"):  # the checkpoint's HF files and --save-hf's copy
        hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
        for k, v in saved.items():
            assert torch.equal(hf[k], v), (directory, k)


def test_a_checkpoint_of_the_other_backend_is_refused(runs, tiny_model_dir, tmp_path):
    from slime.backends.megatron_utils.actor import MegatronTrainActor

    out, _ = runs
    save = str(out / "ckpt")
    args = parse_args(_argv(tiny_model_dir, tmp_path / "fsdp", "--load", save))
    fsdp = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    with pytest.raises(
        SlimeError, match=r"saved by --train-backend megatron, .*resume it with --train-backend megatron"
    ):
        fsdp.init()
    args = parse_args(_argv(tiny_model_dir, tmp_path / "fsdp", "--save", str(tmp_path / "fsdp_ckpt")))
    fsdp = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    fsdp.init()
    fsdp.save(0)
    commit(tmp_path / "fsdp_ckpt", 0)
    args = parse_args(
        _argv(tiny_model_dir, tmp_path / "m", "--train-backend", "megatron", "--load", str(tmp_path / "fsdp_ckpt"))
    )
    actor = MegatronTrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    try:
        with pytest.raises(SlimeError, match=r"saved by --train-backend fsdp, .*--hf-checkpoint"):
            actor.init()
    finally:  # the rank's process group and Megatron's groups, made in this test process
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
