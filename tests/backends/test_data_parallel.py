"""Data parallelism is a configuration change: the real `TrainActor` in 2 gloo processes (FSDP2, each
rank its half of every global batch) makes the same updates as in 1 process, for the same global
batches: the policy's weights, the PPO critic's, and the metrics (losses, grad norms, whitened
advantages' statistics), within 1e-5 relative. The configurations cover `--keep-old-actor`, the
critic (`--advantage-estimator ppo`), cross-rank whitening (`--normalize-advantages`), the KL loss
against a reference model, both loss reductions, LoRA (`--enable-lora`), and the default job's shape (one optimizer step per
rollout: the old log-probs are the training forward's own). Two rollouts (of two optimizer steps
each, but for the last), so Adam's second moments, the LR schedule and the old actor's refresh (as
after a weight sync) are in the comparison.

Exact resume, in the same processes (1 and 2 ranks): a checkpoint after rollout 0, then a new actor
with `--load` trains rollout 1 exactly as the uninterrupted one did (weights, Adam state, LR
schedule, critic, each rank's RNG).

The processes are spawned with `torch.multiprocessing` (no Ray): each builds the actor exactly as a
Ray worker does, trains, and rank 0 writes what it saw."""

from __future__ import annotations

import random

import pytest
import torch

from slime.utils.net import free_port
from tests.helpers import run_ranks

# real processes (1 + 2 spawned gloo ranks, six actors each): 2.7 min on 2 cores shared with a load of ~10
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

# one rollout's data: 8 samples of different prompt / response lengths; --global-batch-size 4 makes
# two optimizer steps; with 2 ranks each takes 2 samples of every step
N = 8


def _data(seed: int) -> dict:
    rng = random.Random(seed)
    tokens, resp, masks, rewards, rollout_lp = [], [], [], [], []
    for i in range(N):
        p, r = rng.randint(2, 6), rng.randint(1, 5)
        tokens.append([rng.randint(8, 300) for _ in range(p + r)])
        resp.append(r)
        masks.append([1] * r if i % 3 else [1] * (r - 1) + [0] if r > 1 else [1])
        rewards.append(rng.uniform(-1, 1))
        rollout_lp.append([-rng.uniform(3, 7) for _ in range(r)])  # the engine's, for the mismatch metric
    return {
        "tokens": tokens,
        "response_lengths": resp,
        "loss_masks": masks,
        "rewards": rewards,
        "rollout_log_probs": rollout_lp,
    }


COMMON = [
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "2",
    "--global-batch-size",
    "4",
    "--micro-batch-size",
    "1",
    "--num-rollout",
    "2",
    "--lr",
    "1e-3",
    # Adam's first update is ~lr*sign(g): float noise on a near-zero gradient would flip it;
    # a large eps makes the update a smooth function of the gradient (equal weights = equal grads)
    "--adam-eps",
    "1e-2",
]
CONFIGS = {
    # the old log-probs from the frozen copy of the served weights; whitening over both ranks; the
    # KL loss against the reference; slime's per-sample mean
    "keep_old_actor_whiten_kl": [
        "--keep-old-actor",
        "--normalize-advantages",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
        "--kl-loss-type",
        "low_var_kl",
    ],
    # PPO: the critic trained beside the policy (values, GAE, clipped value loss), token-sum reduction
    "ppo_critic_per_token": [
        "--advantage-estimator",
        "ppo",
        "--normalize-advantages",
        "--calculate-per-token-loss",
        "--critic-lr",
        "2e-3",
    ],
    # the default job's shape: one optimizer step per rollout, so the old log-probs are the training
    # forward's own (no separate pass) and train/train_rollout_logprob_abs_diff comes from it
    "one_step_per_rollout": ["--global-batch-size", str(N)],
    # LoRA: only the adapter trains (sharded with its layer), the reference is the base with the
    # adapter off, the old actor and the compared state are the merged weights
    "lora_keep_old_actor_kl": [
        "--enable-lora",
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lr",
        "1e-2",
        "--keep-old-actor",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
    ],
    # LoRA under --bf16: the adapted layers' base weights kept in bf16 beside the fp32 adapter, in one
    # FSDP2 group (mixed dtypes); the merged state that leaves the trainer is fp32; 2 ranks' gradients
    # = 1 rank's under autocast (they were not while autocast cached weight casts). One step per
    # rollout: a separate old-log-prob pass would batch samples differently on 1 and 2 ranks, and
    # bf16 matmuls round differently with the batch's shape
    "lora_bf16_base": [
        *("--enable-lora", "--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2", "--bf16"),
        *("--global-batch-size", str(N)),
    ],
}


def _worker(rank: int, world: int, ports: list[int], model_dir: str, out: str) -> None:
    import torch.distributed as dist

    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor
    from slime.utils.checkpoint_layout import commit

    def actor_of(name: str, port: int, *extra: str) -> TrainActor:
        args = parse_args(
            [
                "--hf-checkpoint",
                model_dir,
                "--run-dir",
                f"{out}/run_{name}_{world}",
                "--actor-num-gpus-per-node",
                str(world),
                *COMMON,
                *CONFIGS[name],
                *extra,
            ]
        )
        actor = TrainActor(args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, num_threads=1)
        return actor

    def finish(actor: TrainActor, metrics: list, path: str) -> None:
        from slime.backends.torch import lora

        state = actor.full_state_dict()  # collectives: every rank calls
        critic = actor.critic.state()["model"] if actor.critic is not None else None
        # what an adapter-only weight sync sends (gathered alone, without the base)
        adapter = lora.engine_adapter(lora.gather_adapter(actor.model)) if actor.adapter_sync else None
        if rank == 0:
            torch.save({"metrics": metrics, "state": state, "critic": critic, "adapter": adapter}, path)
        if world > 1:
            dist.destroy_process_group()

    for i, name in enumerate(sorted(CONFIGS)):
        ckpt = f"{out}/ckpt_{name}_{world}"
        actor = actor_of(name, ports[2 * i], "--save", ckpt)
        assert actor.init() == 0
        metrics = []
        for rollout_id in range(2):
            metrics.append(actor.train(rollout_id, _data(rollout_id)))
            actor._snapshot_old_actor()  # what a weight sync does: the engines now serve these weights
            if rollout_id == 0:  # a checkpoint after the first rollout, as --save-interval 1 writes it
                actor.save(0)
                if rank == 0:
                    commit(ckpt, 0)
                rng_at_save = torch.get_rng_state()
                if world > 1:
                    dist.barrier()
        finish(actor, metrics, f"{out}/{name}_{world}.pt")
        # the same run stopped after that checkpoint and resumed from it
        resumed = actor_of(name, ports[2 * i + 1], "--load", ckpt)
        assert resumed.init() == 1
        torch.save({"at_save": rng_at_save, "resumed": torch.get_rng_state()}, f"{out}/rng_{name}_{world}_{rank}.pt")
        finish(resumed, [resumed.train(1, _data(1))], f"{out}/{name}_{world}_resumed.pt")


def _run(world: int, model_dir, out) -> dict:
    """Every configuration in `world` spawned processes; {name: what rank 0 saw}."""
    ports = [free_port() for _ in range(2 * len(CONFIGS))]
    run_ranks(_worker, world, ports, str(model_dir), str(out), timeout=400)
    return {
        name: {way: torch.load(out / f"{name}_{world}{way}.pt", weights_only=True) for way in ("", "_resumed")}
        | {"rng": [torch.load(out / f"rng_{name}_{world}_{r}.pt", weights_only=True) for r in range(world)]}
        for name in CONFIGS
    }


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("data_parallel")
    return _run(1, tiny_model_dir, out), _run(2, tiny_model_dir, out)


def _assert_same_tensors(a: dict, b: dict, what: str, rtol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=rtol, atol=rtol * 1e-2, msg=lambda m, k=k: f"{what} {k}: {m}")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_two_ranks_make_the_same_update_as_one(runs, tiny_model_dir, name):
    one, two = runs[0][name][""], runs[1][name][""]
    for rollout_id, (m1, m2) in enumerate(zip(one["metrics"], two["metrics"], strict=True)):
        compared = [k for k in m1 if not k.startswith("perf/")]
        assert sorted(compared) == sorted(k for k in m2 if not k.startswith("perf/"))
        for key in (
            "train/pg_loss",
            "train/grad_norm",
            "rollout/advantages_std",
            "train/ppo_kl",
            "train/train_rollout_logprob_abs_diff",
        ):
            assert key in compared, key
        for key in compared:
            # abs: train/ppo_kl is a mean of differences of fp32 log-probs of magnitude ~5, whose last
            # bit (~5e-7) depends on the reduction order; everything else is held to 1e-5 relative
            assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-6), (rollout_id, key)
    if "--normalize-advantages" in CONFIGS[name]:  # whitened over both ranks: mean 0, std ~1
        assert abs(two["metrics"][0]["rollout/advantages"]) < 1e-6
        assert two["metrics"][0]["rollout/advantages_std"] == pytest.approx(1.0, rel=0.2)
    _assert_same_tensors(one["state"], two["state"], "policy")
    if name.startswith("ppo"):
        assert "train/value_loss" in one["metrics"][0]
        _assert_same_tensors(one["critic"], two["critic"], "critic")
    else:
        assert one["critic"] is None and two["critic"] is None
    # training moved the weights (the comparison is not of two untouched models)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = max(float((one["state"][k] - start[k]).abs().max()) for k in one["state"] if k in start)
    assert moved > 1e-4
    if "--enable-lora" in CONFIGS[name]:  # the engine's merge of the synced adapter = the trainer's merge
        from slime.engine.lora_weights import LoraBase, LoraRequest

        for run in (one, two):
            modules = sorted({k.rsplit(".lora_", 1)[0] for k in run["adapter"]})
            kept = torch.bfloat16 if "--bf16" in CONFIGS[name] else torch.float32  # the trainer's base, as sent
            base = {f"{m}.weight": start[f"{m}.weight"].to(kept) for m in modules}
            req = LoraRequest(scaling=2.0, base_id="t", with_base=True, modules=modules)  # alpha 8 / rank 4
            merged = LoraBase().expand({**base, **run["adapter"]}, req, closing=True)
            assert merged.keys() == base.keys()
            assert all(torch.equal(merged[k], run["state"][k]) for k in merged)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_resumed_run_continues_exactly(runs, name, world):
    """Stopped after rollout 0's checkpoint and resumed (`--load`): rollout 1's metrics, the policy and
    the critic are the uninterrupted run's (model, Adam moments, LR schedule, critic, RNG restored),
    and every rank has its own RNG state back."""
    got = runs[world - 1][name]
    whole, resumed = got[""], got["_resumed"]
    m_whole, m_resumed = whole["metrics"][1], resumed["metrics"][0]
    for key in (k for k in m_whole if not k.startswith("perf/")):
        assert m_resumed[key] == pytest.approx(m_whole[key], rel=1e-6, abs=1e-9), key
    _assert_same_tensors(whole["state"], resumed["state"], "policy", rtol=1e-6)
    if whole["critic"] is not None:
        _assert_same_tensors(whole["critic"], resumed["critic"], "critic", rtol=1e-6)
    rng = got["rng"]
    for r in rng:
        assert torch.equal(r["at_save"], r["resumed"])
    if world > 1:  # each rank's own (seeded seed + rank), not rank 0's copied
        assert not torch.equal(rng[0]["at_save"], rng[1]["at_save"])
