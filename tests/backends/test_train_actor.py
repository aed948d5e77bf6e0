"""TrainActor in-process (no Ray, no engine): KL to the reference, micro-batching, SFT loss."""

import pytest
import torch

from slime.arguments import parse_args
from slime.backends.torch.actor import TrainActor

DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}


def _actor(tiny_model_dir, tmp_path, *extra):
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


def test_kl_loss_is_zero_against_itself_then_grows(tiny_model_dir, tmp_path):
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
        "--kl-loss-type",
        "low_var_kl",
        "--micro-batch-size",
        "4",
    )
    first = actor.train(0, _copy(DATA))
    assert first["train/kl_loss"] == 0.0  # policy == reference before the first update
    second = actor.train(1, _copy(DATA))
    assert second["train/kl_loss"] > 0.0
    # the reference model never moves
    ref = dict(actor.ref_model.named_parameters())
    from transformers import AutoModelForCausalLM

    orig = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert all(torch.equal(ref[k], orig[k]) for k in orig)


@pytest.mark.parametrize("extra", [[], ["--calculate-per-token-loss"]])
def test_micro_batching_does_not_change_the_update(tiny_model_dir, tmp_path, extra):
    """One optimizer step over 4 samples: 1 micro-batch of 4 == 4 micro-batches of 1 (padding differs too)."""
    # Adam's first step is ~lr*sign(g): float noise on a near-zero gradient would flip it. A large
    # eps makes the update a smooth function of the gradient, so equal weights mean equal gradients.
    smooth = ["--adam-eps", "1e-2"]
    whole = _actor(tiny_model_dir, tmp_path / "a", "--micro-batch-size", "4", *smooth, *extra)
    split = _actor(tiny_model_dir, tmp_path / "b", "--micro-batch-size", "1", *smooth, *extra)
    m_whole = whole.train(0, _copy(DATA))
    m_split = split.train(0, _copy(DATA))
    assert m_whole["train/pg_loss"] == pytest.approx(m_split["train/pg_loss"], rel=1e-5, abs=1e-7)
    assert m_whole["train/grad_norm"] == pytest.approx(m_split["train/grad_norm"], rel=1e-5)
    a, b = whole.full_state_dict(), split.full_state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_sft_loss_is_masked_nll(tiny_model_dir, tmp_path):
    """sft_loss == mean over samples of the mean NLL of their masked response tokens (computed here by hand)."""
    actor = _actor(tiny_model_dir, tmp_path, "--loss-type", "sft_loss", "--micro-batch-size", "4")
    model = actor.model
    expected = 0.0
    with torch.no_grad():
        for toks, r, mask in zip(DATA["tokens"], DATA["response_lengths"], DATA["loss_masks"], strict=True):
            logits = model(torch.tensor([toks])).logits[0]
            logp = torch.log_softmax(logits.double(), -1)
            nll = [-float(logp[len(toks) - r + j - 1, toks[len(toks) - r + j]]) for j in range(r)]
            kept = [x for x, m in zip(nll, mask, strict=True) if m]
            expected += sum(kept) / len(kept)
    expected /= len(DATA["tokens"])
    metrics = actor.train(0, _copy(DATA))
    assert metrics["train/loss"] == pytest.approx(expected, rel=1e-5)


def test_recompute_granularity_checkpoints_without_changing_the_update(tiny_model_dir, tmp_path):
    """Megatron's --recompute-granularity maps to gradient checkpointing: the same step, less memory."""
    smooth = ["--adam-eps", "1e-2", "--micro-batch-size", "4"]
    plain = _actor(tiny_model_dir, tmp_path / "a", *smooth)
    recompute = _actor(
        tiny_model_dir,
        tmp_path / "b",
        *smooth,
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
    )
    checkpointing = (
        "is_activation_checkpointing"
        if hasattr(plain.model, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    assert getattr(recompute.model, checkpointing) and not getattr(plain.model, checkpointing)
    m_plain, m_recompute = plain.train(0, _copy(DATA)), recompute.train(0, _copy(DATA))
    assert m_plain["train/grad_norm"] == pytest.approx(m_recompute["train/grad_norm"], rel=1e-6)
    a, b = plain.full_state_dict(), recompute.full_state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)
