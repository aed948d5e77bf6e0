"""The training rank on megatron-core (`MegatronTrainActor`) against the FSDP `TrainActor`: the same
GRPO rollouts give the same losses, gradient norms and weights on one rank, two tensor-parallel
ranks and 2 (data-parallel) x 2 (tensor-parallel) of them, and PPO's critic the same values, value
losses and updates; options it does not support yet stop at `init`,
naming them."""

from __future__ import annotations

import os

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.errors import SlimeError
from slime.utils.net import free_port
from tests.helpers import run_ranks

pytest.importorskip("megatron.core")

DATA = {  # two prompts x two samples, right-padded into micro-batches of 2
    "tokens": [[5, 6, 7, 8, 9, 10], [5, 6, 7, 10, 11], [12, 13, 14, 15, 16], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [3, 2, 2, 3],
    "loss_masks": [[1, 1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, 0.0, 0.5, -0.5],
}
COMPARED = (
    "train/pg_loss",
    "train/grad_norm",
    "train/loss",
    "train/entropy_loss",
    "train/pg_clipfrac",
    "train/kl_loss",
    "train/value_loss",
    "train/value_clipfrac",
    "train/critic_grad_norm",
)


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


def _argv(model_dir, run_dir, *extra):
    return [
        "--hf-checkpoint", str(model_dir), "--run-dir", str(run_dir),
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--global-batch-size", "2", "--micro-batch-size", "1",  # two optimizer steps per rollout
        "--lr", "1e-2", "--adam-eps", "1e-2", "--clip-grad", "1.0",
        "--calculate-per-token-loss",  # its token count is a sum over the data-parallel ranks only
        # Megatron's parameter groups exempt biases and norm weights from weight decay, the fsdp
        # backend's AdamW decays every weight: without decay both take the same step
        "--weight-decay", "0",
        *extra,
    ]  # fmt: skip


# the algorithm's options, the same on both backends: plain GRPO; KL to a reference that follows
# the policy after every rollout, and old log-probs from the old actor (a frozen copy)
ALGOS = {
    "grpo": (),
    "kl_old_actor": ("--use-kl-loss", "--kl-loss-coef", "0.5", "--keep-old-actor", "--ref-update-interval", "1"),
    "packed": ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "11"),  # samples packed into rows of <= 11 tokens
    "bf16": ("--bf16",),  # mixed precision: both backends' matmuls in bfloat16 (torch autocast), fp32 weights
    "ppo": ("--advantage-estimator", "ppo"),  # a critic (its values feed GAE) trained beside the policy
}
# slime's scripts' block: activations split along the sequence between the layers, every layer recomputed
SP_RECOMPUTE = ("--sequence-parallel", "--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1")  # fmt: skip
# how close the backends are: fp32 to rounding; bf16 matmuls round differently in the two models'
# kernels (transformers' fused attention, Megatron's unfused one), ~1e-2 relative per product
TOL = {"grpo": 1e-5, "kl_old_actor": 1e-5, "packed": 1e-5, "bf16": 3e-2, "ppo": 1e-5}
# name: (ranks, tensor-parallel, megatron's options, algorithm)
LAYOUTS = {
    "dp1": (1, 1, (), "grpo"),
    "tp2": (2, 2, (), "grpo"),
    "dp2_tp2_distopt_sp": (4, 2, ("--use-distributed-optimizer", "--sequence-parallel"), "grpo"),
    "tp2_kl_old_actor_offload": (2, 2, ("--offload-train",), "kl_old_actor"),
    "tp2_packed_sp_recompute": (2, 2, (*SP_RECOMPUTE,), "packed"),
    "tp2_bf16": (2, 2, (), "bf16"),
    "tp2_ppo_sp_offload": (2, 2, ("--sequence-parallel", "--offload-train"), "ppo"),
}


def _worker(rank: int, world: int, port: int, model_dir: str, out: str, name: str, tp: int, more: tuple) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainActor

    os.environ["OMP_NUM_THREADS"] = "1"
    layout = (
        "--actor-num-gpus-per-node",
        str(world),
        "--tensor-model-parallel-size",
        str(tp),
        "--train-backend",
        "megatron",
    )
    args = parse_args(_argv(model_dir, f"{out}/run_{name}", *layout, *more))
    actor = MegatronTrainActor(
        args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, num_threads=1
    )
    actor.init()
    metrics = [actor.train(0, _copy(DATA))]
    if args.offload_train:  # Adam's state leaves memory and comes back bit for bit
        metrics[0].update(actor.offload())
        actor.onload()
    metrics.append(actor.train(1, _copy(DATA)))
    state = actor.full_state_dict()
    if rank == 0:
        config = actor.policy.model.config
        split = (actor.policy.tensor_parallel, actor.dp.size, config.sequence_parallel, config.recompute_granularity)
        torch.save({"metrics": metrics, "state": state, "split": split}, f"{out}/megatron_actor_{name}.pt")


@pytest.fixture(scope="module")
def megatron_runs(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron-actor")
    runs = {}
    for name, (world, tp, more, algo) in LAYOUTS.items():
        run_ranks(_worker, world, free_port(), str(tiny_model_dir), str(out), name, tp, (*more, *ALGOS[algo]))
        runs[name] = torch.load(out / f"megatron_actor_{name}.pt", weights_only=False)
    return runs


@pytest.fixture(scope="module")
def fsdp_runs(tiny_model_dir, tmp_path_factory):
    runs = {}
    for algo, options in ALGOS.items():
        args = parse_args(_argv(tiny_model_dir, tmp_path_factory.mktemp("fsdp"), *options))
        actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
        actor.init()
        metrics = [actor.train(i, _copy(DATA)) for i in range(2)]
        runs[algo] = {"metrics": metrics, "state": actor.full_state_dict()}
    return runs


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_trains_as_the_fsdp_trainer(megatron_runs, fsdp_runs, tiny_model_dir, layout):
    from transformers import AutoModelForCausalLM

    got = megatron_runs[layout]
    world, tp, options, algo = LAYOUTS[layout]
    fsdp_run = fsdp_runs[algo]
    # the model is split, each group one data-parallel rank; the options reached Megatron's config
    recompute = "full" if "--recompute-granularity" in options else None
    assert got["split"] == (tp, world // tp, "--sequence-parallel" in options, recompute)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert max(float((fsdp_run["state"][k] - v).abs().max()) for k, v in initial.items()) > 1e-3  # it trained
    for rollout, (m, ref) in enumerate(zip(got["metrics"], fsdp_run["metrics"], strict=True)):
        for key in COMPARED:
            if key in ref:
                assert m[key] == pytest.approx(ref[key], rel=TOL[algo], abs=TOL[algo] / 10), (rollout, key)
        assert "train/pg_loss" in m and m["train/grad_norm"] > 0
    if algo == "kl_old_actor":  # the reference and the policy differ at every rollout's second step
        assert all(abs(m["train/kl_loss"]) > 1e-6 for m in got["metrics"])
    if algo == "ppo":  # the critic trained: its second rollout's values come from the updated critic
        assert all(m["train/critic_grad_norm"] > 0 and m["train/value_loss"] > 0 for m in got["metrics"])
    if algo == "bf16":  # bfloat16 matmuls really ran: not the fp32 step of the same layout
        fp32 = megatron_runs["tp2"]["metrics"][0]["train/grad_norm"]
        assert abs(got["metrics"][0]["train/grad_norm"] - fp32) > 1e-6 * fp32
    if "--offload-train" in LAYOUTS[layout][2]:  # Adam's two moments of this rank's shards were written out
        assert got["metrics"][0]["offload_bytes"] > 0
    start = fsdp_run["state"]
    assert got["state"].keys() == start.keys()
    for k, v in start.items():
        torch.testing.assert_close(got["state"][k], v, rtol=0, atol=TOL[algo], msg=lambda msg, k=k: f"{k}: {msg}")


def test_what_it_does_not_do_yet_stops_naming_it(tiny_model_dir, tmp_path):
    from slime.backends.megatron_utils.actor import MegatronTrainActor

    args = parse_args(_argv(tiny_model_dir, tmp_path, "--enable-lora"))
    actor = MegatronTrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    with pytest.raises(SlimeError, match=r"does not support LoRA yet"):
        actor.init()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--pipeline-model-parallel-size", "2"), r"does not support --pipeline-model-parallel-size 2 yet"),
    ],
)
def test_parallel_layouts_it_cannot_build_stop_naming_them(tiny_model_dir, tmp_path, option, message):
    from slime.backends.megatron_utils.actor import check_run

    with pytest.raises(SlimeError, match=message):
        check_run(parse_args(_argv(tiny_model_dir, tmp_path, "--train-backend", "megatron", *option)))


HOOK_CALLS: list = []


def record_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """slime's before-train-step hook: what a Megatron run hands it."""
    grads = [p.main_grad for p in model[0].parameters() if getattr(p, "main_grad", None) is not None]
    HOOK_CALLS.append(
        ("train_step", rollout_id, step_id, type(model[0]).__name__, type(optimizer).__name__,
         type(opt_param_scheduler).__name__, optimizer.param_groups[0]["lr"], bool(grads) and not any(g.any() for g in grads))
    )  # fmt: skip


def record_log_prob(args, model, store_prefix):
    HOOK_CALLS.append(("log_prob", store_prefix, type(model[0]).__name__, model[0].training))


def _hook_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainActor

    hooks = (
        "--custom-megatron-before-train-step-hook-path", f"{__name__}.record_train_step",
        "--custom-megatron-before-log-prob-hook-path", f"{__name__}.record_log_prob",
        "--lr-warmup-iters", "2", "--use-kl-loss", "--keep-old-actor",
    )  # fmt: skip
    args = parse_args(_argv(model_dir, f"{out}/run", "--train-backend", "megatron", *hooks))
    actor = MegatronTrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, num_threads=1)
    actor.init()
    metrics = [actor.train(i, _copy(DATA)) for i in range(2)]
    torch.save({"calls": HOOK_CALLS, "lr": [m["train/lr"] for m in metrics]}, f"{out}/hooks.pt")


def test_slimes_megatron_hooks_get_megatrons_objects(tiny_model_dir, tmp_path):
    run_ranks(_hook_worker, 1, free_port(), str(tiny_model_dir), str(tmp_path))
    got = torch.load(tmp_path / "hooks.pt", weights_only=False)
    steps = [c for c in got["calls"] if c[0] == "train_step"]
    assert [(c[1], c[2]) for c in steps] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for _, _, _, model, optimizer, scheduler, _, zeroed in steps:
        assert (model, optimizer, scheduler) == (
            "DistributedDataParallel",
            "ChainedOptimizer",
            "OptimizerParamScheduler",
        )
        assert zeroed  # the gradient buffers are clear when the hook runs
    # the LR each step is about to use: warm-up over 2 steps from 0 to --lr, then the default linear
    # decay to --min-lr 0 at the last of the run's 4 steps
    assert [c[6] for c in steps] == pytest.approx([0.0, 5e-3, 1e-2, 5e-3])
    assert got["lr"] == pytest.approx([2.5e-3, 7.5e-3])  # the metric: the mean over the rollout's steps
    log_probs = [c[1:] for c in got["calls"] if c[0] == "log_prob"]
    assert ("", "GPTModel", False) in log_probs and ("ref_", "GPTModel", False) in log_probs
