"""slime's training options on the torch backend: CISPO, custom TIS and pg-loss reducer hooks,
rollout entropy, training without advantages, frozen parameters, optimizer-state checkpoints and
reset, the training actors' environment. Parsing against slime's dest/default; behaviour against
references computed here (plain loops) or on a real tiny-model train step (in-process, no Ray)."""

from __future__ import annotations

import importlib
import logging
import math
from types import SimpleNamespace

import pytest
import torch

from slime.algorithms.losses import cispo_loss, policy_loss_ppo_clip, reduce_loss
from slime.arguments import build_parser, parse_args
from slime.backends.torch.actor import TrainActor
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import TRAINER_STATE_FILE, commit

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]
DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11, 3], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 3, 2, 3],
    "loss_masks": [[1, 1], [1, 0, 1], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}
HERE = "tests.backends.test_slime_training_options"
pytestmark = pytest.mark.filterwarnings("ignore:Seems like:UserWarning")  # optimizer.step is patched on purpose


def _actor(tiny_model_dir, tmp_path, *extra, num_rollout=4):
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            str(num_rollout),
            "--lr",
            "1e-2",
            "--run-dir",
            str(tmp_path),
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


def _capture_grads(actor):
    """Record the policy gradient of each optimizer step and apply nothing."""
    grads: dict[str, torch.Tensor] = {}

    def step():
        for n, p in actor.model.named_parameters():
            if p.grad is not None:
                grads[n] = grads.get(n, 0) + p.grad.detach().clone()

    actor.optimizer.step = step
    return grads


def _weights(actor):
    return {n: p.detach().clone() for n, p in actor.model.named_parameters()}


def _response_logits(model, data, i):
    """Logits (float64) predicting each response token of sample i, and those tokens."""
    toks, r = data["tokens"][i], data["response_lengths"][i]
    logits = model(torch.tensor([toks])).logits[0].double()
    p = len(toks) - r
    return logits[p - 1 : p + r - 1], toks[p:]


# ------------------------------------------------------------------ parsing: slime's dest and default


def _action(option):
    return next(a for a in build_parser()._actions if option in a.option_strings)


def test_dests_and_defaults_are_slimes():
    # Values read from slime/utils/arguments.py (THUDM/slime, commit 624b824a): add_algo_arguments,
    # add_train_arguments and the reset_arg of --no-save-optim.
    slime = {
        "--disable-compute-advantages-and-returns": ("compute_advantages_and_returns", True, 0),
        "--use-rollout-entropy": ("use_rollout_entropy", False, 0),
        "--custom-tis-function-path": ("custom_tis_function_path", None, None),
        "--custom-pg-loss-reducer-function-path": ("custom_pg_loss_reducer_function_path", None, None),
        "--only-train-params-name-list": ("only_train_params_name_list", None, "*"),
        "--freeze-params-name-list": ("freeze_params_name_list", None, "*"),
        "--no-save-optim": ("no_save_optim", False, 0),
        "--reset-optimizer-states": ("reset_optimizer_states", False, 0),
        "--train-env-vars": ("train_env_vars", "{}", None),  # type=json.loads: parses to {}
    }
    for option, (dest, default, nargs) in slime.items():
        a = _action(option)
        assert (a.dest, a.default, a.nargs) == (dest, default, nargs), option
    assert "cispo" in _action("--advantage-estimator").choices and _action("--advantage-estimator").default == "grpo"
    args = parse_args(BASE)
    assert args.compute_advantages_and_returns is True and args.train_env_vars == {}
    assert args.no_save_optim is False and args.reset_optimizer_states is False
    assert (
        parse_args(
            BASE + ["--disable-compute-advantages-and-returns", "--loss-type", "sft_loss"]
        ).compute_advantages_and_returns
        is False
    )
    args = parse_args(
        BASE + ["--freeze-params-name-list", "embed", r"layers\.0\.", "--train-env-vars", '{"MY_VAR": "x", "N": 4}']
    )
    assert args.freeze_params_name_list == ["embed", r"layers\.0\."]
    assert args.train_env_vars == {"MY_VAR": "x", "N": "4"}  # Ray's env_vars take strings


@pytest.mark.parametrize(
    "extra,names",
    [
        (
            ["--only-train-params-name-list", "a", "--freeze-params-name-list", "b"],
            ["--only-train-params-name-list", "--freeze-params-name-list"],
        ),
        (
            ["--freeze-params-name-list", "layers.(0"],
            ["--freeze-params-name-list", "'layers.(0'", "regular expression"],
        ),
        (["--train-env-vars", "{oops"], ["--train-env-vars", "expected JSON"]),
        (["--train-env-vars", '["A"]'], ["--train-env-vars", "JSON object"]),
        (["--train-env-vars", '{"A": {"b": 1}}'], ["--train-env-vars", "A must be a string"]),
        (["--custom-tis-function-path", "m.f"], ["--custom-tis-function-path", "--use-tis"]),
        (
            ["--custom-pg-loss-reducer-function-path", "m.f", "--loss-type", "sft_loss"],
            ["--custom-pg-loss-reducer-function-path", "--loss-type sft_loss"],
        ),
        (["--advantage-estimator", "cispo", "--eps-clip-c", "3"], ["--eps-clip-c", "--advantage-estimator cispo"]),
        (
            ["--disable-compute-advantages-and-returns", "--advantage-estimator", "ppo"],
            ["--advantage-estimator ppo", "--disable-compute-advantages-and-returns"],
        ),
        (
            ["--disable-compute-advantages-and-returns"],
            ["--loss-type policy_loss", "--disable-compute-advantages-and-returns", "--rollout-data-postprocess-path"],
        ),
        (
            ["--disable-compute-advantages-and-returns", "--loss-type", "sft_loss", "--use-rollout-entropy"],
            ["--use-rollout-entropy"],
        ),
        (
            [
                "--disable-compute-advantages-and-returns",
                "--loss-type",
                "custom_loss",
                "--custom-loss-function-path",
                "m.f",
                "--use-kl-loss",
            ],
            ["--use-kl-loss", "--disable-compute-advantages-and-returns"],
        ),
    ],
)
def test_bad_combinations_stop_at_parsing_naming_the_options(extra, names):
    with pytest.raises(SlimeError) as e:
        parse_args(BASE + extra)
    for n in names:
        assert n in str(e.value), (n, str(e.value))


def test_cispo_with_active_lower_bound_warns_as_slime(caplog):
    with caplog.at_level(logging.WARNING):
        parse_args(BASE + ["--advantage-estimator", "cispo"])
    assert "--eps-clip 0.2 keeps the lower clip bound 0.8 active" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        parse_args(BASE + ["--advantage-estimator", "cispo", "--eps-clip", "1.0", "--eps-clip-high", "4.0"])
    assert "cispo" not in caplog.text


# ------------------------------------------------------------------ CISPO: the formula


@pytest.mark.parametrize("eps_clip,eps_clip_high", [(0.2, 0.28), (1.0, 4.0)])
def test_cispo_loss_against_a_plain_loop(eps_clip, eps_clip_high):
    ratios = [1.0, 1.14, 1.56, 0.4, 9.0, 0.7]
    adv = [1.0, -0.5, 2.0, -1.0, 0.3, -2.0]
    logp = [-0.7, -1.2, -0.4, -2.1, -0.05, -3.0]
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.tensor([math.log(r) for r in ratios], dtype=torch.float64)  # ratio = exp(lp - old)
    ppo_kl = old - lp  # depends on lp: CISPO must not differentiate through the ratio
    pg, clipfrac = cispo_loss(ppo_kl, lp, torch.tensor(adv, dtype=torch.float64), eps_clip, eps_clip_high)
    pg.sum().backward()
    for t in range(len(ratios)):
        w = min(max(ratios[t], 1.0 - eps_clip), 1.0 + eps_clip_high)
        assert float(pg[t].detach()) == pytest.approx(-w * adv[t] * logp[t], rel=1e-12)
        assert float(clipfrac[t]) == (1.0 if w != pytest.approx(ratios[t], rel=1e-12) else 0.0)
        # d/dlp of -sg(w) * A * lp = -w * A: clipped tokens keep a gradient
        assert float(lp.grad[t]) == pytest.approx(-w * adv[t], rel=1e-12)
    if eps_clip == 0.2:  # PPO's clip gives clipped tokens no gradient at all: the two differ
        lp2 = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
        ppo, _, _ = policy_loss_ppo_clip(lp2, old, torch.tensor(adv, dtype=torch.float64), eps_clip, eps_clip_high)
        ppo.sum().backward()
        assert float(lp2.grad[2]) == 0.0 and float(lp.grad[2]) != 0.0


def test_sample_denominators_replace_the_mask_totals():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    masks = [[0, 1], [1, 0, 1]]  # numerators over these masks ...
    denoms = [2.0, 3.0]  # ... denominators from the masks before a hook rejected tokens
    got = reduce_loss(x, [2, 3], masks, num_samples=4, sample_denoms=denoms)
    assert float(got) == pytest.approx(((2.0) / 2.0 + (3.0 + 5.0) / 3.0) / 4)
    assert float(reduce_loss(x, [2, 3], masks, num_samples=4)) == pytest.approx((2.0 / 1 + 8.0 / 2) / 4)


# ------------------------------------------------------------------ CISPO on a tiny-model train step


def _off_policy(actor, data, shift):
    """Rollout log-probs = the trainer's minus ``shift`` per token: ratios exp(shift) on the first step."""
    d = _copy(data)
    lp = actor._forward_only(d, list(range(len(d["tokens"]))), actor.model)
    d["rollout_log_probs"] = [(x - torch.tensor(s[: x.numel()])).tolist() for x, s in zip(lp, shift, strict=True)]
    return d


SHIFT = [[0.5, -0.1], [0.05, 0.9, -1.5], [-0.4, 0.0], [0.1, 1.2, -0.02]]


@pytest.mark.parametrize("estimator", ["cispo", "grpo"])
def test_cispo_train_step_gradient_matches_the_formula(tiny_model_dir, tmp_path, estimator):
    """Old policy = engine log-probs (--use-rollout-logprobs), ratios far from 1: the policy gradient of
    one step equals that of (1/N) sum_i mean_t -sg(clip(ratio)) * A_i * log p_t, built here token by token."""
    no_clip = ["--clip-grad", "1e9"]  # the reference below is the raw gradient
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--advantage-estimator",
        "cispo",
        "--use-rollout-logprobs",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "4",
        *no_clip,
    )
    data = _off_policy(actor, DATA, SHIFT)
    ref_model = actor.model
    grads = _capture_grads(actor)
    m = actor.train(0, _copy(data))

    lo, hi = 1.0 - actor.args.eps_clip, 1.0 + actor.args.eps_clip_high
    ref_model.zero_grad()
    total, clipped, n_tok = 0.0, 0.0, 0
    for i in range(4):
        logits, targets = _response_logits(ref_model, data, i)
        logp = torch.log_softmax(logits, -1)
        terms, clip_i = [], 0.0
        for t, tok in enumerate(targets):
            if not data["loss_masks"][i][t]:
                continue
            ratio = math.exp(float(logp[t, tok].detach()) - data["rollout_log_probs"][i][t])
            w = min(max(ratio, lo), hi)
            clip_i += float(w != ratio)
            terms.append(-w * data["rewards"][i] * logp[t, tok])
        total = total + sum(terms) / len(terms)
        clipped += clip_i / len(terms)
        n_tok += len(terms)
    (total / 4).backward()
    ref_grads = {n: p.grad.float() for n, p in ref_model.named_parameters() if p.grad is not None}
    diff = max(float((grads[n] - g).abs().max()) for n, g in ref_grads.items())
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    if estimator == "cispo":
        assert diff <= 1e-5 * scale
        assert m["train/pg_clipfrac"] == pytest.approx(clipped / 4, abs=1e-6) and clipped > 0
        assert m["train/pg_loss"] == pytest.approx(float(total) / 4, rel=1e-5)
    else:  # the same data under grpo's PPO clip: a different gradient (the test can fail)
        grpo = _actor(
            tiny_model_dir,
            tmp_path / "g",
            "--use-rollout-logprobs",
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "4",
            *no_clip,
        )
        g2 = _capture_grads(grpo)
        grpo.train(0, _copy(data))
        assert max(float((g2[n] - g).abs().max()) for n, g in ref_grads.items()) > 1e-3 * scale


# ------------------------------------------------------------------ --custom-tis-function-path

TIS_CALLS: list[dict] = []


def half_and_reject_first(
    args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths, **kwargs
):
    """A TIS/RS hook: halves every token's loss, rejects each sample's first token."""
    TIS_CALLS.append(
        dict(
            pg_loss=pg_loss.detach().clone(),
            train=[t.clone() for t in train_log_probs],
            rollout=[r.clone() for r in rollout_log_probs],
            masks=[m.clone() for m in loss_masks],
            total_lengths=list(total_lengths),
            response_lengths=list(response_lengths),
        )
    )
    new_masks = [torch.cat([torch.zeros(1), m[1:]]) for m in loss_masks]
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    return pg_loss * 0.5, new_masks, {"my_ratio": ratio}


def test_custom_tis_function_contract_and_reductions(tiny_model_dir, tmp_path):
    calls = importlib.import_module(HERE).TIS_CALLS  # the module the hook path loads (pytest's may differ)
    calls.clear()
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-tis",
        "--custom-tis-function-path",
        f"{HERE}.half_and_reject_first",
        "--micro-batch-size",
        "4",
    )
    data = _off_policy(actor, DATA, SHIFT)
    m = actor.train(0, _copy(data))
    (call,) = calls
    assert call["total_lengths"] == [len(t) for t in DATA["tokens"]]
    assert call["response_lengths"] == DATA["response_lengths"]
    assert [m_.tolist() for m_ in call["masks"]] == DATA["loss_masks"]
    for i in range(4):  # the trainer's old log-probs and the engine's, per sample
        assert call["rollout"][i].tolist() == pytest.approx(data["rollout_log_probs"][i])
        assert (call["train"][i] - call["rollout"][i]).tolist() == pytest.approx(
            SHIFT[i][: DATA["response_lengths"][i]], abs=1e-5
        )
    pg = torch.split(call["pg_loss"], DATA["response_lengths"])
    # pg_loss: numerators over the hook's masks (first token rejected), denominators the delivered masks
    expected_pg, expected_ratio = 0.0, 0.0
    for i, mask in enumerate(DATA["loss_masks"]):
        kept = sum(0.5 * float(pg[i][t]) for t in range(1, len(mask)) if mask[t])
        expected_pg += kept / sum(mask)
        expected_ratio += sum(math.exp(SHIFT[i][t]) for t in range(len(mask)) if mask[t]) / sum(mask)
    assert m["train/pg_loss"] == pytest.approx(expected_pg / 4, rel=1e-5, abs=1e-7)
    # the hook's metrics over the tokens before rejection, as slime
    assert m["train/my_ratio"] == pytest.approx(expected_ratio / 4, rel=1e-5)
    assert "train/tis" not in m and "train/ois" in m


# ------------------------------------------------------------------ --custom-pg-loss-reducer-function-path

REDUCER_CALLS: list[dict] = []


def token_sum_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """Sum over every trained token (ignoring sample boundaries), times 3."""
    REDUCER_CALLS.append(
        dict(
            total_lengths=list(total_lengths),
            response_lengths=list(response_lengths),
            masks=[torch.as_tensor(m).tolist() for m in loss_masks],
            per_token=calculate_per_token_loss,
        )
    )

    def reduce(x):
        REDUCER_CALLS[-1]["x"] = x.detach().clone()
        return 3.0 * (x * torch.cat([torch.as_tensor(m, dtype=x.dtype) for m in loss_masks])).sum()

    return reduce


@pytest.mark.parametrize("per_token", [False, True])
def test_custom_pg_loss_reducer_replaces_only_the_pg_reduction(tiny_model_dir, tmp_path, per_token):
    calls = importlib.import_module(HERE).REDUCER_CALLS
    calls.clear()
    extra = ["--micro-batch-size", "2", "--entropy-coef", "0.0", *(["--calculate-per-token-loss"] if per_token else [])]
    custom = _actor(
        tiny_model_dir, tmp_path / "c", "--custom-pg-loss-reducer-function-path", f"{HERE}.token_sum_reducer", *extra
    )
    default = _actor(tiny_model_dir, tmp_path / "d", *extra)
    mc, md = custom.train(0, _copy(DATA)), default.train(0, _copy(DATA))
    assert len(calls) == 2  # one per micro-batch
    assert calls[0]["total_lengths"] == [5, 6] and calls[0]["response_lengths"] == [2, 3]
    assert calls[0]["masks"] == DATA["loss_masks"][:2] and calls[0]["per_token"] is per_token
    # the reducer's sum, divided by the global batch's samples (or tokens): slime's scaling
    denom = sum(sum(m) for m in DATA["loss_masks"]) if per_token else 4
    expected = 0.0
    for call in calls:
        x = torch.split(call["x"], call["response_lengths"])
        expected += 3.0 * sum(
            float(x[i][t]) for i, mask in enumerate(call["masks"]) for t in range(len(mask)) if mask[t]
        )
    assert mc["train/pg_loss"] == pytest.approx(expected / denom, rel=1e-5, abs=1e-7)
    assert mc["train/pg_loss"] != pytest.approx(md["train/pg_loss"], rel=1e-3)
    # everything else keeps the default reduction
    for key in ("train/pg_clipfrac", "train/ppo_kl", "train/entropy_loss"):
        assert mc[key] == pytest.approx(md[key], rel=1e-6, abs=1e-9), key


# ------------------------------------------------------------------ --use-rollout-entropy

SEEN: dict = {}


def record_and_mask_sample0(args, rollout_id, rollout_data):
    SEEN.update(
        {
            k: [torch.as_tensor(x).clone() for x in rollout_data[k]]
            for k in ("entropy", "ref_entropy")
            if k in rollout_data
        }
    )
    masks = [list(map(int, torch.as_tensor(m).tolist())) for m in rollout_data["loss_masks"]]
    masks[0] = [0] * len(masks[0])  # a "special loss mask" set from the hook
    rollout_data["loss_masks"] = masks


def test_rollout_entropy_for_hooks_and_metrics(tiny_model_dir, tmp_path):
    seen = importlib.import_module(HERE).SEEN
    seen.clear()
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-rollout-entropy",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.0",
        "--rollout-data-postprocess-path",
        f"{HERE}.record_and_mask_sample0",
        "--micro-batch-size",
        "4",
        "--adam-eps",
        "1e-2",
    )
    model = actor.model
    with torch.no_grad():
        ref = []
        for i in range(4):
            logits, _ = _response_logits(model, DATA, i)
            p = torch.softmax(logits, -1)
            ref.append(
                [-sum(float(p[t, v]) * math.log(float(p[t, v])) for v in range(p.shape[1])) for t in range(p.shape[0])]
            )
    grads = _capture_grads(actor)
    m = actor.train(0, _copy(DATA))
    for key in ("entropy", "ref_entropy"):  # policy == reference before any update
        assert [x.tolist() for x in seen[key]] == [pytest.approx(r, rel=1e-5) for r in ref]
    # rollout/entropy: mean over the trained tokens (after the hook's mask)
    kept = [(i, t) for i, mask in enumerate(DATA["loss_masks"]) for t in range(len(mask)) if mask[t] and i != 0]
    assert m["rollout/entropy"] == pytest.approx(sum(ref[i][t] for i, t in kept) / len(kept), rel=1e-5)
    # the hook's mask is the one trained on: same gradient as data whose sample 0 is masked out
    other = _actor(tiny_model_dir, tmp_path / "o", "--micro-batch-size", "4", "--adam-eps", "1e-2")
    g2 = _capture_grads(other)
    masked = _copy(DATA)
    masked["loss_masks"][0] = [0, 0]
    other.train(0, masked)
    for n, g in g2.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-8)
    without = _actor(tiny_model_dir, tmp_path / "w", "--micro-batch-size", "4")
    g3 = _capture_grads(without)
    without.train(0, _copy(DATA))
    assert any(float((grads[n] - g).abs().max()) > 1e-6 for n, g in g3.items())


# ------------------------------------------------------------------ --disable-compute-advantages-and-returns

CUSTOM_BATCH_KEYS: list[set] = []


def nll_loss(args, batch, logits, sum_of_sample_mean):
    from slime.algorithms.losses import compute_log_probs

    CUSTOM_BATCH_KEYS.append(set(batch))
    lp = compute_log_probs(logits, torch.cat(batch["response_tokens"]))
    loss = -sum_of_sample_mean(lp)
    return loss, {"nll": loss.detach()}


def set_reward_advantages(args, rollout_id, rollout_data):
    rollout_data["advantages"] = [
        torch.full((len(m),), float(r))
        for m, r in zip(rollout_data["loss_masks"], rollout_data["rewards"], strict=True)
    ]


def test_custom_loss_trains_without_advantages(tiny_model_dir, tmp_path, monkeypatch):
    keys = importlib.import_module(HERE).CUSTOM_BATCH_KEYS
    keys.clear()
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--disable-compute-advantages-and-returns",
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        f"{HERE}.nll_loss",
        "--micro-batch-size",
        "2",
    )

    def no_forward(*a, **k):
        raise AssertionError("no old/reference forward pass without advantages")

    monkeypatch.setattr(actor, "_forward_only", no_forward)
    before = _weights(actor)
    m = actor.train(0, _copy(DATA))
    assert not ({"advantages", "returns", "old_log_probs", "ref_log_probs"} & set().union(*keys)) and keys
    assert m["train/nll"] > 0 and math.isfinite(m["train/grad_norm"])
    assert not any(k.startswith("rollout/advantages") for k in m)
    after = _weights(actor)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_policy_loss_without_advantages_takes_them_from_the_hook(tiny_model_dir, tmp_path):
    """No old log-probs: the policy is its own old policy (slime); hook advantages = the rewards, so the
    first step's gradient is grpo's exactly."""
    hooked = _actor(
        tiny_model_dir,
        tmp_path / "h",
        "--disable-compute-advantages-and-returns",
        "--rollout-data-postprocess-path",
        f"{HERE}.set_reward_advantages",
        "--micro-batch-size",
        "4",
    )
    plain = _actor(tiny_model_dir, tmp_path / "p", "--micro-batch-size", "4")
    g1, g2 = _capture_grads(hooked), _capture_grads(plain)
    m1, m2 = hooked.train(0, _copy(DATA)), plain.train(0, _copy(DATA))
    assert m1["train/pg_loss"] == pytest.approx(m2["train/pg_loss"], rel=1e-6)
    for n, g in g2.items():
        torch.testing.assert_close(g1[n], g, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------ frozen parameters


@pytest.mark.parametrize(
    "option,patterns,frozen_if",
    [
        (
            "--freeze-params-name-list",
            ["embed_tokens", r"layers\.1\.mlp"],
            lambda n: "embed_tokens" in n or ".layers.1.mlp." in n,
        ),
        (
            "--only-train-params-name-list",
            [r"layers\.0\.self_attn\.q_proj", "norm.weight$"],
            lambda n: not (".layers.0.self_attn.q_proj." in n or n.endswith("norm.weight")),
        ),
    ],
)
def test_frozen_parameters_get_no_gradient_and_do_not_move(tiny_model_dir, tmp_path, option, patterns, frozen_if):
    actor = _actor(tiny_model_dir, tmp_path, option, *patterns, "--weight-decay", "0.1", "--micro-batch-size", "2")
    names = [n for n, _ in actor.model.named_parameters()]
    frozen = {n for n in names if frozen_if(n)}
    assert frozen and len(frozen) < len(names)
    assert {n for n, p in actor.model.named_parameters() if not p.requires_grad} == frozen
    in_optimizer = {id(p) for g in actor.optimizer.param_groups for p in g["params"]}
    assert all((id(p) in in_optimizer) != (n in frozen) for n, p in actor.model.named_parameters())
    before = _weights(actor)
    grads_seen: dict[str, torch.Tensor | None] = {}
    real_step = actor.optimizer.step

    def step(*a, **k):
        grads_seen.update({n: p.grad for n, p in actor.model.named_parameters()})
        return real_step(*a, **k)

    actor.optimizer.step = step
    actor.train(0, _copy(DATA))
    after = _weights(actor)
    moved = 0
    for n in names:
        if n in frozen:
            assert grads_seen[n] is None and torch.equal(before[n], after[n]), n
        else:
            assert grads_seen[n] is not None, n
            if float(grads_seen[n].abs().max()) > 0:  # (a key bias's gradient is exactly 0: softmax ignores it)
                assert not torch.equal(before[n], after[n]), n
                moved += 1
    assert moved >= 3


@pytest.mark.parametrize("option", ["--freeze-params-name-list", "--only-train-params-name-list"])
def test_a_pattern_matching_no_parameter_stops_naming_option_and_pattern(tiny_model_dir, tmp_path, option):
    with pytest.raises(SlimeError) as e:
        _actor(tiny_model_dir, tmp_path, option, "embed_tokens", "output_layer")  # Megatron's name, not HF's
    assert option in str(e.value) and "'output_layer'" in str(e.value) and "model.embed_tokens.weight" in str(e.value)


def test_freezing_everything_stops(tiny_model_dir, tmp_path):
    with pytest.raises(SlimeError, match="--freeze-params-name-list freezes every parameter"):
        _actor(tiny_model_dir, tmp_path, "--freeze-params-name-list", ".")


# ------------------------------------------------------------------ --no-save-optim


def test_no_save_optim_checkpoint_resumes_with_a_fresh_optimizer(tiny_model_dir, tmp_path, caplog):
    save = tmp_path / "ckpt"
    actor = _actor(tiny_model_dir, tmp_path / "a", "--no-save-optim", "--save", str(save), "--micro-batch-size", "4")
    actor.train(0, _copy(DATA))
    out = actor.save(0)
    state = torch.load(f"{out}/{TRAINER_STATE_FILE}", weights_only=True)
    assert "optimizer" not in state and state["rollout_id"] == 0 and "scheduler" in state
    commit(save, 0)  # what the driver does once both sides saved
    with caplog.at_level(logging.WARNING):
        resumed = _actor(tiny_model_dir, tmp_path / "b", "--load", str(save), "--micro-batch-size", "4")
    assert "no optimizer state (saved with --no-save-optim); starting a fresh optimizer" in caplog.text
    assert len(resumed.optimizer.state) == 0
    for n, w in _weights(actor).items():
        assert torch.equal(w, _weights(resumed)[n])
    resumed.train(1, _copy(DATA))  # trains on from there

    # the default keeps the optimizer (of the trainable parameters): Adam's moments come back as saved
    save2 = tmp_path / "ckpt2"
    freeze = ["--freeze-params-name-list", "embed_tokens"]
    full = _actor(tiny_model_dir, tmp_path / "c", "--save", str(save2), "--micro-batch-size", "4", *freeze)
    full.train(0, _copy(DATA))
    assert "optimizer" in torch.load(f"{full.save(0)}/{TRAINER_STATE_FILE}", weights_only=True)
    commit(save2, 0)
    caplog.clear()
    back = _actor(tiny_model_dir, tmp_path / "d", "--load", str(save2), "--micro-batch-size", "4", *freeze)
    assert "fresh optimizer" not in caplog.text
    saved = [full.optimizer.state[p]["exp_avg"] for g in full.optimizer.param_groups for p in g["params"]]
    loaded = [back.optimizer.state[p]["exp_avg"] for g in back.optimizer.param_groups for p in g["params"]]
    assert len(saved) == len(loaded) > 0 and all(torch.equal(a, b) for a, b in zip(saved, loaded, strict=True))


def test_no_save_optim_leaves_the_critic_optimizer_out_too(tiny_model_dir, tmp_path):
    save = tmp_path / "ckpt"
    ppo = ["--advantage-estimator", "ppo", "--micro-batch-size", "4", "--no-save-optim"]
    actor = _actor(tiny_model_dir, tmp_path / "a", *ppo, "--save", str(save))
    actor.train(0, _copy(DATA))
    out = actor.save(0)
    assert sorted(torch.load(f"{out}/critic_state.pt", weights_only=True)) == ["model", "scheduler"]
    commit(save, 0)
    resumed = _actor(tiny_model_dir, tmp_path / "b", *ppo, "--load", str(save))
    assert len(resumed.critic.optimizer.state) == 0
    assert resumed.critic.scheduler.last_epoch == actor.critic.scheduler.last_epoch > 0
    for (n, w), (_, v) in zip(
        actor.critic.model.named_parameters(), resumed.critic.model.named_parameters(), strict=True
    ):
        assert torch.equal(w, v), n


# ------------------------------------------------------------------ --reset-optimizer-states


def _second_rollout_update(actor):
    """Train rollout 0, then rollout 1 recording its gradient and learning rate; return (grads, lr, weight
    change) of rollout 1."""
    actor.train(0, _copy(DATA))
    grads: dict[str, torch.Tensor] = {}
    lr: list[float] = []
    real_step = actor.optimizer.step

    def step(*a, **k):
        grads.update({n: p.grad.detach().clone() for n, p in actor.model.named_parameters() if p.grad is not None})
        lr.append(actor.optimizer.param_groups[0]["lr"])
        return real_step(*a, **k)

    actor.optimizer.step = step
    before = _weights(actor)
    actor.train(1, _copy(DATA))
    return grads, lr[0], {n: w - before[n] for n, w in _weights(actor).items()}


def test_reset_optimizer_states_makes_each_rollout_start_adam_afresh(tiny_model_dir, tmp_path):
    """After a reset, Adam's step is a first step: delta = -lr * g / (|g| + eps) (bias-corrected moments
    g and g^2), computed here element by element."""
    eps = 1e-3
    common = ["--micro-batch-size", "4", "--adam-eps", str(eps), "--weight-decay", "0.0"]
    reset = _actor(tiny_model_dir, tmp_path / "r", "--reset-optimizer-states", *common)
    grads, lr, delta = _second_rollout_update(reset)
    for n, g in grads.items():
        expected = -lr * g.double() / (g.double().abs() + eps)
        torch.testing.assert_close(delta[n].double(), expected, rtol=1e-4, atol=1e-7)
    assert all(int(s["step"]) == 1 for s in reset.optimizer.state.values())
    keep = _actor(tiny_model_dir, tmp_path / "k", *common)
    grads_k, lr, delta_k = _second_rollout_update(keep)
    assert all(int(s["step"]) == 2 for s in keep.optimizer.state.values())
    off = max(
        float((delta_k[n].double() + lr * g.double() / (g.double().abs() + eps)).abs().max())
        for n, g in grads_k.items()
    )
    assert off > 1e-5  # without the reset the moments carry over: not a first step


# ------------------------------------------------------------------ --train-env-vars


def test_train_env_vars_reach_the_training_actors(monkeypatch):
    """RayTrainGroup starts each TrainActor with --train-env-vars in its Ray runtime_env (slime's actor_group)."""
    import slime.ray.train_group as train_group

    seen: list[dict] = []

    class FakeActor:
        @staticmethod
        def options(**kw):
            seen.append(kw)
            # the group then asks each rank to bind itself to its cores (pin_cores)
            return SimpleNamespace(remote=lambda *a: SimpleNamespace(pin_cores=SimpleNamespace(remote=lambda *a: None)))

    monkeypatch.setattr(train_group, "RayTrainActor", FakeActor)
    monkeypatch.setattr(train_group.ray, "get", lambda refs: [None] * len(refs))
    placement = SimpleNamespace(actor_cpus=0.5, actor_bundles=[0], actors=[], strategy=lambda b: f"bundle{b}")
    args = parse_args(BASE + ["--train-env-vars", '{"PYTORCH_TEST_VAR": "1", "N": 2}'])
    train_group.RayTrainGroup(args, placement)
    assert seen[0]["runtime_env"]["env_vars"] == {"PYTORCH_TEST_VAR": "1", "N": "2"}
    seen.clear()
    train_group.RayTrainGroup(parse_args(BASE), placement)
    assert "runtime_env" not in seen[0]  # nothing to add: the job's environment as before


# ------------------------------------------------------------------ CISPO's rewards: grpo's group normalisation


@pytest.mark.parametrize("std", [True, False])
def test_cispo_rewards_are_group_normalised_like_grpo(std):
    """slime's _post_process_rewards treats cispo as grpo / gspo (group mean, then / (unbiased std + 1e-6))."""
    from slime.rollout.train_data import post_process_rewards
    from slime.utils.types import Sample

    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5]
    args = parse_args(
        [
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "4",
            "--num-rollout",
            "1",
            "--advantage-estimator",
            "cispo",
            "--eps-clip",
            "1.0",
            *([] if std else ["--disable-grpo-std-normalization"]),
        ]
    )
    samples = [Sample(reward=r, response_length=1) for r in rewards]
    raw, got = post_process_rewards(args, samples)
    expected = []
    for g in range(2):
        group = rewards[4 * g : 4 * g + 4]
        mean = sum(group) / 4
        sd = math.sqrt(sum((r - mean) ** 2 for r in group) / 3)
        expected += [(r - mean) / (sd + 1e-6) if std else r - mean for r in group]
    assert raw == rewards and got == pytest.approx(expected, rel=1e-5, abs=1e-6)
