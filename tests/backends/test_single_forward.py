"""One forward where one suffices: with one optimizer step per rollout and no option that
reads the old log-probs before the training forward, the old log-probs are that forward's own,
detached (ratio exactly 1), and the separate no-grad pass is skipped. Forcing the separate pass
(`TrainActor.reuse_training_forward = False`) gives the same losses, metrics and updated weights;
with several steps per rollout, or an option that needs the old log-probs first, the pass runs once
per rollout either way. The real actor, in-process (no Ray)."""

from __future__ import annotations

import random

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.rollout_batch import can_reuse_training_forward

N = 8


def _data(seed: int) -> dict:
    """8 samples with rollout log-probs (what the engine reports), uneven lengths and masks."""
    rng = random.Random(seed)
    out: dict = {"tokens": [], "response_lengths": [], "loss_masks": [], "rewards": [], "rollout_log_probs": []}
    for i in range(N):
        p, r = rng.randint(2, 6), rng.randint(2, 5)
        out["tokens"].append([rng.randint(8, 300) for _ in range(p + r)])
        out["response_lengths"].append(r)
        out["loss_masks"].append([1] * (r - 1) + [i % 2])
        out["rewards"].append(rng.uniform(-1, 1))
        out["rollout_log_probs"].append([-rng.uniform(3, 7) for _ in range(r)])
    return out


def _actor(model_dir, run_dir, extra, reuse: bool) -> TrainActor:
    args = parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--run-dir",
            str(run_dir),
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "2",
            "--lr",
            "1e-3",
            "--micro-batch-size",
            "2",
            # a smooth Adam update (see test_train_actor): equal weights mean equal gradients
            "--adam-eps",
            "1e-2",
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    actor.reuse_training_forward = reuse
    calls: list[int] = []
    forward_only = actor._forward_only

    def counted(data, indices, model, entropy_out=None):
        if model is actor.model or model is actor.old_actor:  # the old-log-prob pass (not the reference's)
            calls.append(len(indices))
        return forward_only(data, indices, model, entropy_out)

    actor._forward_only = counted
    actor.old_pass_calls = calls
    return actor


ONE_STEP = ["--global-batch-size", str(N)]
CASES = {
    "default": [],
    "kl_loss_unbiased_per_token": [
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
        "--use-unbiased-kl",
        "--calculate-per-token-loss",
    ],
    "gspo_entropy_whiten": ["--advantage-estimator", "gspo", "--entropy-coef", "0.01", "--normalize-advantages"],
    "cispo": ["--advantage-estimator", "cispo", "--eps-clip", "1.0", "--eps-clip-high", "4.0"],
    "ppo_critic": ["--advantage-estimator", "ppo"],
    "packed": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "24"],
    # TIS weights (old against rollout log-probs, clipped on both sides here) read the old log-probs in the loss
    "tis": ["--use-tis", "--tis-clip", "1.5", "--tis-clip-low", "0.5"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_step_reuses_the_training_forward_with_the_same_numbers(tiny_model_dir, tmp_path, case):
    extra = [*ONE_STEP, *CASES[case]]
    on, off = (
        _actor(tiny_model_dir, tmp_path / "on", extra, True),
        _actor(tiny_model_dir, tmp_path / "off", extra, False),
    )
    for rollout_id in range(2):
        m_on, m_off = on.train(rollout_id, _data(rollout_id)), off.train(rollout_id, _data(rollout_id))
        keys = sorted(k for k in m_off if not k.startswith("perf/"))
        assert sorted(k for k in m_on if not k.startswith("perf/")) == keys
        assert "train/train_rollout_logprob_abs_diff" in keys and "train/pg_loss" in keys
        for key in keys:
            assert m_on[key] == pytest.approx(m_off[key], rel=1e-5, abs=1e-6), (rollout_id, key)
        assert m_on["train/ppo_kl"] == 0.0 and m_on["train/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert on.old_pass_calls == [] and off.old_pass_calls == [N, N]  # the separate pass: only when forced
    a, b = on.full_state_dict(), off.full_state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7, msg=k)
    if on.critic is not None:
        ca, cb = on.critic.model.state_dict(), off.critic.model.state_dict()
        for k in ca:
            torch.testing.assert_close(ca[k], cb[k], rtol=1e-5, atol=1e-7, msg=k)


def test_the_logprob_diff_is_the_training_forwards(tiny_model_dir, tmp_path):
    """train/train_rollout_logprob_abs_diff from the reused forward, against a plain HF forward here."""
    actor = _actor(tiny_model_dir, tmp_path, ONE_STEP, True)
    data = _data(0)
    with torch.no_grad():
        total, count = 0.0, 0
        for toks, r, mask, rlp in zip(
            data["tokens"], data["response_lengths"], data["loss_masks"], data["rollout_log_probs"], strict=True
        ):
            logp = torch.log_softmax(actor.model(torch.tensor([toks])).logits[0].double(), -1)
            for j in range(r):
                if mask[j]:
                    pos = len(toks) - r + j
                    total += abs(float(logp[pos - 1, toks[pos]]) - rlp[j])
                    count += 1
    metrics = actor.train(0, data)
    assert actor.old_pass_calls == []
    assert metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize(
    "extra",
    [
        ["--global-batch-size", str(N // 2)],  # two steps: the second is off-policy, old log-probs needed
        [*ONE_STEP, "--use-opsm"],
        [*ONE_STEP, "--keep-old-actor"],
        [*ONE_STEP, "--get-mismatch-metrics"],
        [*ONE_STEP, "--use-rollout-entropy"],
        [*ONE_STEP, "--advantage-estimator", "reinforce_plus_plus", "--kl-coef", "0.1"],
    ],
    ids=["two_steps", "opsm", "keep_old_actor", "mismatch_metrics", "rollout_entropy", "kl_in_reward"],
)
def test_options_that_need_the_old_log_probs_keep_one_batched_pass(tiny_model_dir, tmp_path, extra):
    actor = _actor(tiny_model_dir, tmp_path, extra, True)
    actor.train(0, _data(0))
    assert actor.old_pass_calls == [N]  # once per rollout, over all of the rollout's samples


def test_dropout_keeps_the_separate_pass(tiny_model_dir, tmp_path):
    """In train mode dropout would make the training forward differ from the old policy's."""
    actor = _actor(tiny_model_dir, tmp_path, ONE_STEP, True)
    assert can_reuse_training_forward(actor.args, actor.model, actor.old_actor, 1, False)
    actor.model.config.attention_dropout = 0.1
    assert not can_reuse_training_forward(actor.args, actor.model, actor.old_actor, 1, False)


# ---- the lean step's pieces, each against the plain way computed here ------------------------------


def _columns(n: int = 6, seed: int = 0) -> dict:
    rng = random.Random(seed)
    data: dict = {"tokens": [], "response_lengths": [], "loss_masks": []}
    for _ in range(n):
        p, r = rng.randint(2, 7), rng.randint(1, 5)
        data["tokens"].append([rng.randrange(3, 300) for _ in range(p + r)])
        data["response_lengths"].append(r)
        data["loss_masks"].append([rng.randint(0, 1) for _ in range(r)])
    return data


@pytest.mark.parametrize("packed", [False, True])
def test_response_logits_only_on_response_positions_equal_the_full_output(tiny_model_dir, packed):
    """The output layer runs only where a response token is predicted (transformers' logits_to_keep
    with a boolean mask); the rows equal the full forward's at those positions, in the same order."""
    from transformers import AutoModelForCausalLM

    from slime.backends.torch.batching import build_micro_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    mb = build_micro_batch(_columns(), [0, 2, 3, 5], packed=packed)
    with torch.no_grad():
        full = mb.forward(model)[mb.rows, mb.cols]
        kept = mb.response_logits(model)
    assert kept.shape == full.shape == (sum(mb.response_lengths), model.config.vocab_size)
    torch.testing.assert_close(kept, full, rtol=1e-5, atol=1e-5)


def test_padded_micro_batch_layout_matches_a_row_by_row_build():
    from slime.backends.torch.batching import make_micro_batch

    data = _columns(7, seed=3)
    idx = [6, 1, 4]
    mb = make_micro_batch(data, idx, pad_id=0)
    width = max(len(data["tokens"][i]) for i in idx)
    for row, i in enumerate(idx):
        t, r = data["tokens"][i], data["response_lengths"][i]
        assert mb.input_ids[row].tolist() == t + [0] * (width - len(t))
        assert mb.attention_mask[row].tolist() == [1] * len(t) + [0] * (width - len(t))
        assert mb.loss_masks[row].tolist() == [float(m) for m in data["loss_masks"][i]]
    rows, cols = [], []
    for row, i in enumerate(idx):
        p, r = len(data["tokens"][i]) - data["response_lengths"][i], data["response_lengths"][i]
        rows += [row] * r
        cols += range(p - 1, p + r - 1)
    assert mb.rows.tolist() == rows and mb.cols.tolist() == cols
    assert mb.targets.tolist() == [t for i in idx for t in data["tokens"][i][-data["response_lengths"][i] :]]


def test_a_loss_mask_of_the_wrong_length_is_refused_naming_the_sample():
    from slime.backends.torch.batching import build_micro_batch

    data = _columns(4)
    data["loss_masks"][2] = data["loss_masks"][2] + [1]
    for packed in (False, True):
        with pytest.raises(ValueError, match="sample 2: loss mask has"):
            build_micro_batch(data, [0, 1, 2, 3], packed=packed)


def test_pack_is_a_plain_concatenation():
    from slime.backends.torch.batching import pack

    lists = [[0.5, 1.5], [], [2.0], [3.0, 4.0, 5.0]]
    tensors = [torch.tensor(x) for x in lists]
    expected = [v for i in (3, 0, 2) for v in lists[i]]
    assert pack(lists, [3, 0, 2]).tolist() == expected == pack(tensors, [3, 0, 2]).tolist()
    assert pack([torch.tensor([[1.0, 2.0]]), [3.0]], [0, 1]).tolist() == [1.0, 2.0, 3.0]  # mixed, 2-D
    assert pack(lists, []).numel() == 0


def test_entropy_as_a_metric_only_has_the_same_values_and_no_graph(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from slime.backends.torch.batching import build_micro_batch, response_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    mb = build_micro_batch(_columns(), [0, 1, 2], packed=False)
    lp, ent = response_log_probs(model, mb, 0.7, with_entropy=True)
    lp2, ent2 = response_log_probs(model, mb, 0.7, with_entropy=True, entropy_grad=False)
    assert ent.requires_grad and not ent2.requires_grad and lp2.requires_grad
    torch.testing.assert_close(ent2, ent.detach(), rtol=0, atol=0)
    torch.testing.assert_close(lp2, lp, rtol=0, atol=0)
