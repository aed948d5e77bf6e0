"""The algorithm suite wired into TrainActor (in-process, no Ray): invariances, first-step identities,
critic, reference / old-actor updates, LR schedule, hooks."""

import math

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.optim import lr_at
from slime.backends.torch.rollout_batch import prepare_rl_batch
from slime.errors import SlimeError

DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11, 3], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 3, 2, 3],
    "loss_masks": [[1, 1], [1, 0, 1], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}
pytestmark = pytest.mark.filterwarnings("ignore:Seems like:UserWarning")  # optimizer.step is patched on purpose

ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "ppo"]


def _actor(tiny_model_dir, tmp_path, *extra, double=False):
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "4",
            "--lr",
            "1e-2",
            "--run-dir",
            str(tmp_path),
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    if double:  # float64 so that layout differences show up only as real bugs, not rounding
        for m in (actor.model, actor.ref_model, actor.critic.model if actor.critic else None):
            if m is not None:
                m.double()
    return actor


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


def _with_rollout_log_probs(actor, data):
    """Rollout log-probs equal to the trainer's (what the engine reports for the same weights)."""
    d = _copy(data)
    lp = actor._forward_only(d, list(range(len(d["tokens"]))), actor.model)
    d["rollout_log_probs"] = [x.tolist() for x in lp]
    return d


def _capture_grads(actor):
    """Record the gradients each optimizer would apply, and apply nothing."""
    grads = {}
    opts = [("actor", actor.model, actor.optimizer)]
    if actor.critic is not None:
        opts.append(("critic", actor.critic.model, actor.critic.optimizer))
    for tag, model, opt in opts:

        def step(tag=tag, model=model):
            for n, p in model.named_parameters():
                if p.grad is not None:
                    grads[f"{tag}.{n}"] = grads.get(f"{tag}.{n}", 0) + p.grad.detach().clone()

        opt.step = step
    return grads


def _rel(a, b):
    return float((a - b).norm() / max(float(a.norm()), 1e-30))


# ------------------------------------------------------------------ invariances (<= 1e-6 relative)

LAYOUTS = {
    "padded, 1 micro-batch": ["--micro-batch-size", "4"],
    "padded, 4 micro-batches": ["--micro-batch-size", "1"],
    "packed, 1 micro-batch": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "1000"],
    "packed, token budget 12": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "12"],
    "packed, token budget 1": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "1"],
}


@pytest.mark.parametrize(
    "estimator,extra",
    [
        ("grpo", ["--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01"]),
        ("gspo", ["--calculate-per-token-loss"]),
        ("cispo", ["--eps-clip", "1.0", "--eps-clip-high", "4.0", "--entropy-coef", "0.01"]),
        ("ppo", ["--kl-coef", "0.05", "--normalize-advantages"]),
        ("reinforce_plus_plus", ["--use-tis", "--use-opsm", "--log-probs-chunk-size", "2"]),
    ],
)
def test_layout_leaves_loss_and_gradients_unchanged(tiny_model_dir, tmp_path, estimator, extra):
    """Micro-batch splitting, packing vs padding and dynamic (token-budget) micro-batches: same loss, same grads."""
    results = {}
    for name, layout in LAYOUTS.items():
        actor = _actor(
            tiny_model_dir,
            tmp_path / name.replace(" ", "_").replace(",", ""),
            "--advantage-estimator",
            estimator,
            *extra,
            *layout,
            double=True,
        )
        data = _with_rollout_log_probs(actor, DATA)
        grads = _capture_grads(actor)
        metrics = actor.train(0, data)
        results[name] = (metrics, grads)
    base_m, base_g = results["padded, 1 micro-batch"]
    for name, (m, g) in results.items():
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/value_loss", "train/kl_loss"):
            if key in base_m:
                assert m[key] == pytest.approx(base_m[key], rel=1e-6, abs=1e-12), (name, key)
        assert g.keys() == base_g.keys()
        for k in base_g:
            assert _rel(base_g[k], g[k]) <= 1e-6, (name, k)


# ------------------------------------------------------------------ first step is on-policy


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_first_step_ppo_kl_zero_and_nothing_clipped(tiny_model_dir, tmp_path, estimator):
    actor = _actor(tiny_model_dir, tmp_path, "--advantage-estimator", estimator, "--micro-batch-size", "2", "--use-tis")
    data = _with_rollout_log_probs(actor, DATA)
    m = actor.train(0, data)
    assert m["train/ppo_kl"] == 0.0 and m["train/pg_clipfrac"] == 0.0
    assert m["train/train_rollout_logprob_abs_diff"] == 0.0
    assert m["train/tis"] == pytest.approx(1.0) and m["train/tis_clipfrac"] == 0.0
    for k, v in m.items():
        assert math.isfinite(v), k


def test_several_steps_per_rollout_move_off_policy(tiny_model_dir, tmp_path):
    actor = _actor(tiny_model_dir, tmp_path, "--num-steps-per-rollout", "2", "--micro-batch-size", "1")
    grads = []
    orig = actor._optimizer_step

    def spy(data, idx, kw):
        out = orig(data, idx, kw)
        grads.append(out)
        return out

    actor._optimizer_step = spy
    actor.train(0, _copy(DATA))
    assert grads[0]["train/ppo_kl"] == 0.0 and grads[1]["train/ppo_kl"] != 0.0


# ------------------------------------------------------------------ PPO critic


def test_ppo_critic_trains_and_critic_only_steps_freeze_the_policy(tiny_model_dir, tmp_path):
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--advantage-estimator",
        "ppo",
        "--num-critic-only-steps",
        "1",
        "--micro-batch-size",
        "4",
        "--critic-lr",
        "1e-2",
        "--lambd",
        "0.95",
    )
    policy0 = {k: v.clone() for k, v in actor.model.state_dict().items()}
    critic0 = {k: v.clone() for k, v in actor.critic.model.state_dict().items()}
    m0 = actor.train(0, _copy(DATA))
    assert "train/pg_loss" not in m0 and m0["train/value_loss"] > 0 and "train/value_clipfrac" in m0
    assert all(torch.equal(policy0[k], v) for k, v in actor.model.state_dict().items())
    assert any(not torch.equal(critic0[k], v) for k, v in actor.critic.model.state_dict().items())
    m1 = actor.train(1, _copy(DATA))
    assert "train/pg_loss" in m1 and m1["train/value_loss"] < m0["train/value_loss"]
    assert any(not torch.equal(policy0[k], v) for k, v in actor.model.state_dict().items())
    assert math.isfinite(m1["rollout/values"]) and math.isfinite(m1["rollout/returns"])


def test_ppo_advantages_are_gae_of_critic_values(tiny_model_dir, tmp_path):
    """With gamma = lambd = 1 and kl_coef 0, A_t = R - V_t (GAE telescopes)."""
    actor = _actor(tiny_model_dir, tmp_path, "--advantage-estimator", "ppo", "--micro-batch-size", "4")
    data = _copy(DATA)
    mine = list(range(4))
    batch, _ = prepare_rl_batch(actor._batch_models(), data, mine)
    values = actor.critic.values(data, mine)
    for i in mine:
        want = DATA["rewards"][i] - values[i]
        torch.testing.assert_close(batch.advantages[i], want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ reference, old actor, schedule


def test_ref_update_interval_copies_the_policy(tiny_model_dir, tmp_path):
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
        "--ref-update-interval",
        "2",
        "--micro-batch-size",
        "4",
    )
    actor.train(0, _copy(DATA))
    assert not all(
        torch.equal(a, b) for a, b in zip(actor.ref_model.parameters(), actor.model.parameters(), strict=True)
    )
    actor.train(1, _copy(DATA))
    assert all(torch.equal(a, b) for a, b in zip(actor.ref_model.parameters(), actor.model.parameters(), strict=True))


def test_keep_old_actor_tracks_the_served_weights(tiny_model_dir, tmp_path, monkeypatch):
    actor = _actor(tiny_model_dir, tmp_path, "--keep-old-actor", "--micro-batch-size", "4")
    m = actor.train(0, _copy(DATA))
    assert m["train/ppo_kl"] == 0.0
    # weights changed, engines not yet updated: the old actor still holds the served weights
    m = actor.train(1, _copy(DATA))
    assert m["train/ppo_kl"] != 0.0
    monkeypatch.setattr("slime.sync.tensor.push_weights", lambda *a, **k: None)
    actor.update_weights([], "2")
    assert actor.train(2, _copy(DATA))["train/ppo_kl"] == 0.0


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_lr_schedule_matches_megatron_formula(style):
    lr, mn, warm, decay = 1.0, 0.1, 4, 14
    for k in range(20):
        got = lr_at(k, lr, style=style, warmup=warm, decay_iters=decay, min_lr=mn)
        if k < warm:
            want = lr * k / warm
        elif style == "constant":
            want = lr
        else:
            r = min((k - warm) / (decay - warm), 1.0)
            coeff = 1 - r if style == "linear" else 0.5 * (1 + math.cos(math.pi * r))
            want = mn + coeff * (lr - mn)
        assert got == pytest.approx(want, abs=1e-12), (style, k)


def test_trainer_follows_the_lr_schedule(tiny_model_dir, tmp_path):
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--lr-warmup-iters",
        "2",
        "--lr-decay-style",
        "linear",
        "--min-lr",
        "1e-3",
        "--micro-batch-size",
        "4",
    )
    lrs = [actor.train(i, _copy(DATA))["train/lr"] for i in range(4)]
    assert lrs == pytest.approx([0.0, 5e-3, 1e-2, 1e-2 - 0.5 * (1e-2 - 1e-3)])


# ------------------------------------------------------------------ hooks


def custom_adv(args, rollout_data):
    rollout_data["advantages"] = [torch.full_like(lp, 2.0) for lp in rollout_data["log_probs"]]
    rollout_data["returns"] = rollout_data["advantages"]


def custom_loss(args, batch, logits, sum_of_sample_mean):
    from slime.algorithms.losses import compute_log_probs

    lp = compute_log_probs(logits, torch.cat(batch["response_tokens"]))
    loss = -sum_of_sample_mean(lp)
    return loss, {"nll": loss.detach()}


def test_custom_advantage_and_loss_hooks(tiny_model_dir, tmp_path):
    actor = _actor(
        tiny_model_dir,
        tmp_path / "a",
        "--custom-advantage-function-path",
        "tests.backends.test_train_algorithms.custom_adv",
        "--micro-batch-size",
        "4",
    )
    m = actor.train(0, _copy(DATA))
    assert m["rollout/advantages"] == pytest.approx(2.0) and m["train/pg_loss"] == pytest.approx(-2.0)
    sft = _actor(tiny_model_dir, tmp_path / "b", "--loss-type", "sft_loss", "--micro-batch-size", "4")
    custom = _actor(
        tiny_model_dir,
        tmp_path / "c",
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "tests.backends.test_train_algorithms.custom_loss",
        "--micro-batch-size",
        "4",
    )
    assert custom.train(0, _copy(DATA))["train/nll"] == pytest.approx(sft.train(0, _copy(DATA))["train/loss"], rel=1e-6)


def test_opd_with_teacher_in_trainer(tiny_model_dir, tmp_path):
    """Teacher == student: reverse KL is 0 and the advantages are the estimator's."""
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-opd",
        "--opd-type",
        "megatron",
        "--opd-teacher-load",
        str(tiny_model_dir),
        "--micro-batch-size",
        "4",
    )
    m = actor.train(0, _copy(DATA))
    assert m["train/opd_reverse_kl"] == pytest.approx(0.0, abs=1e-7)


# ------------------------------------------------------------------ bad combinations stop at parsing


@pytest.mark.parametrize(
    "extra,names",
    [
        (["--use-dynamic-batch-size"], ["--use-dynamic-batch-size", "--max-tokens-per-gpu"]),
        (
            ["--use-tis", "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout"],
            ["--use-tis", "--rollout-function-path"],
        ),
        (["--use-tis", "--loss-type", "sft_loss"], ["--use-tis", "--loss-type sft_loss"]),
        (["--advantage-estimator", "ppo", "--loss-type", "sft_loss"], ["--advantage-estimator ppo", "--loss-type"]),
        (["--num-critic-only-steps", "2"], ["--num-critic-only-steps", "--advantage-estimator ppo"]),
        (["--kl-coef", "0.1"], ["--kl-coef", "--advantage-estimator grpo"]),
        (["--use-opd"], ["--use-opd", "--opd-type"]),
        (["--use-opd", "--opd-type", "megatron"], ["--opd-type megatron", "--opd-teacher-load"]),
        (["--loss-type", "custom_loss"], ["--loss-type custom_loss", "--custom-loss-function-path"]),
        (["--ref-update-interval", "2"], ["--ref-update-interval", "--use-kl-loss"]),
        (["--use-rollout-logprobs", "--keep-old-actor"], ["--use-rollout-logprobs", "--keep-old-actor"]),
        (["--eps-clip-c", "0.5"], ["--eps-clip-c"]),
        (["--overlong-buffer-len", "4096"], ["--overlong-buffer-len", "--rollout-max-response-len"]),
        (["--use-unbiased-kl"], ["--use-unbiased-kl", "--use-kl-loss"]),
        (["--min-lr", "1"], ["--min-lr", "--lr"]),
    ],
)
def test_incompatible_options_name_both_arguments(tiny_model_dir, tmp_path, extra, names):
    with pytest.raises(SlimeError) as e:
        parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--rollout-batch-size",
                "2",
                "--num-rollout",
                "1",
                "--run-dir",
                str(tmp_path),
                *extra,
            ]
        )
    for n in names:
        assert n in str(e.value), (n, str(e.value))
