"""Log-probs, entropy, reductions, PPO-clip and SFT losses against hand-computed references."""

import math

import pytest
import torch

from slime.algorithms.losses import (
    compute_entropy,
    compute_log_probs,
    masked_mean,
    policy_loss_ppo_clip,
    reduce_loss,
    sft_loss,
    sum_of_sample_mean,
    sum_of_token,
)

torch.manual_seed(0)


# ---------------------------------------------------------------- log-probs / entropy


def manual_log_softmax_at(row, target, temperature):
    z = [v / temperature for v in row]
    m = max(z)
    log_norm = m + math.log(sum(math.exp(v - m) for v in z))
    return z[target] - log_norm


def manual_entropy(row, temperature):
    z = [v / temperature for v in row]
    m = max(z)
    exps = [math.exp(v - m) for v in z]
    s = sum(exps)
    return -sum((e / s) * math.log(e / s) for e in exps if e > 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_log_probs_match_manual_loop(temperature):
    logits = torch.randn(2, 3, 5, dtype=torch.float64) * 3
    targets = torch.randint(0, 5, (2, 3))
    got = compute_log_probs(logits, targets, temperature=temperature)
    assert got.shape == (2, 3)
    for b in range(2):
        for t in range(3):
            want = manual_log_softmax_at(logits[b, t].tolist(), targets[b, t].item(), temperature)
            assert got[b, t].item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_log_probs_fp32_from_bf16_and_chunked_equal():
    logits = (torch.randn(7, 11) * 4).to(torch.bfloat16)
    targets = torch.randint(0, 11, (7,))
    full = compute_log_probs(logits, targets, temperature=0.8)
    assert full.dtype == torch.float32
    chunked = compute_log_probs(logits, targets, temperature=0.8, chunk_size=3)
    assert torch.allclose(full, chunked)
    ref = torch.log_softmax(logits.float() / 0.8, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(full, ref, atol=1e-6)


def test_log_probs_extreme_logits_finite_and_grad():
    logits = torch.tensor([[1000.0, 0.0, -1000.0]], requires_grad=True)
    lp = compute_log_probs(logits, torch.tensor([1]))
    assert lp.item() == pytest.approx(-1000.0)
    lp.sum().backward()
    # d/dz_j log p_1 = 1[j=1] - p_j
    assert logits.grad.tolist()[0] == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)


def test_log_probs_shape_mismatch_and_bad_temperature():
    with pytest.raises(ValueError):
        compute_log_probs(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError):
        compute_log_probs(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), temperature=0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_entropy_matches_manual(temperature):
    logits = torch.randn(4, 6, dtype=torch.float64) * 2
    got = compute_entropy(logits, temperature=temperature)
    for i in range(4):
        assert got[i].item() == pytest.approx(manual_entropy(logits[i].tolist(), temperature), rel=1e-10)
    uniform = compute_entropy(torch.zeros(3, 8))
    assert torch.allclose(uniform, torch.full((3,), math.log(8)))


def test_entropy_with_masked_vocab_is_finite():
    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]], requires_grad=True)
    h = compute_entropy(logits)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


# ---------------------------------------------------------------- reductions

LENGTHS = [3, 0, 2, 4]
MASKS = [[1, 0, 1], [], [0, 0], [1, 1, 1, 0]]
X = [1.0, 100.0, 3.0, 5.0, 7.0, 2.0, 4.0, 6.0, 1000.0]


def manual_sample_means():
    means, k = [], 0
    for n, m in zip(LENGTHS, MASKS, strict=True):
        vals = [X[k + j] for j in range(n) if m[j]]
        means.append(sum(vals) / len(vals) if vals else 0.0)
        k += n
    return means


def test_sum_of_sample_mean_with_empty_and_fully_masked():
    x = torch.tensor(X, requires_grad=True)
    masks = [torch.tensor(m, dtype=torch.int64) for m in MASKS]
    got = sum_of_sample_mean(x, LENGTHS, masks)
    assert got.item() == pytest.approx(sum(manual_sample_means()))  # 2 + 0 + 0 + 4
    assert got.item() == pytest.approx(6.0)
    got.backward()
    assert x.grad.tolist() == pytest.approx([0.5, 0, 0.5, 0, 0, 1 / 3, 1 / 3, 1 / 3, 0])


def test_masked_positions_holding_nan_do_not_leak():
    x = torch.tensor(X)
    x[1] = float("nan")
    x[8] = float("inf")
    assert sum_of_sample_mean(x, LENGTHS, MASKS).item() == pytest.approx(6.0)
    assert sum_of_token(x, LENGTHS, MASKS).item() == pytest.approx(1 + 3 + 2 + 4 + 6)


def test_reduce_loss_denominators():
    x = torch.tensor(X)
    assert reduce_loss(x, LENGTHS, MASKS).item() == pytest.approx(6.0 / 4)
    assert reduce_loss(x, LENGTHS, MASKS, num_samples=8).item() == pytest.approx(6.0 / 8)
    assert reduce_loss(x, LENGTHS, MASKS, calculate_per_token_loss=True).item() == pytest.approx(16.0 / 5)
    assert reduce_loss(x, LENGTHS, MASKS, calculate_per_token_loss=True, num_tokens=10).item() == pytest.approx(1.6)
    # all masked: 0, not NaN
    z = reduce_loss(torch.ones(2), [2], [[0, 0]], calculate_per_token_loss=True)
    assert z.item() == 0.0
    assert reduce_loss(torch.zeros(0), [], []).item() == 0.0


def test_reduction_validation():
    with pytest.raises(ValueError, match="sum to"):
        sum_of_sample_mean(torch.zeros(5), [2, 2], [[1, 1], [1, 1]])
    with pytest.raises(ValueError, match="loss mask 1"):
        sum_of_sample_mean(torch.zeros(4), [2, 2], [[1, 1], [1]])
    with pytest.raises(ValueError):
        sum_of_sample_mean(torch.zeros(4), [2, 2], [[1, 1]])


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
    assert masked_mean(x, m, dim=-1).tolist() == pytest.approx([2.0, 0.0])
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_sft_loss_is_masked_nll():
    lp = torch.tensor([-1.0, -2.0, -3.0, -0.5])
    masks = [[1, 1], [0, 1]]
    assert sft_loss(lp, [2, 2], masks).item() == pytest.approx(((1 + 2) / 2 + 0.5) / 2)
    assert sft_loss(lp, [2, 2], masks, calculate_per_token_loss=True).item() == pytest.approx(3.5 / 3)


# ---------------------------------------------------------------- PPO clip


def ref_ppo(ratio, adv, eps, eps_high=None, eps_c=None):
    """Plain-Python PPO-clip: returns (loss, clipped, dloss/dlog_prob)."""
    eps_high = eps if eps_high is None else eps_high
    unclipped = -ratio * adv
    clipped_ratio = min(max(ratio, 1 - eps), 1 + eps_high)
    clipped = -clipped_ratio * adv
    if clipped > unclipped:
        loss, was_clipped, grad = clipped, 1.0, 0.0
    else:
        loss, was_clipped, grad = unclipped, 0.0, -ratio * adv
    if eps_c is not None and adv < 0 and -eps_c * adv < loss:
        loss, grad = -eps_c * adv, 0.0
    return loss, was_clipped, grad


def run_ppo(ratios, advs, **kw):
    log_probs = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(len(ratios), dtype=torch.float64)
    adv = torch.tensor(advs, dtype=torch.float64)
    loss, clipfrac, ppo_kl = policy_loss_ppo_clip(log_probs, old, adv, **kw)
    loss.sum().backward()
    return loss, clipfrac, ppo_kl, log_probs.grad


def test_ppo_hand_values_symmetric():
    # ratios below / inside / above [0.8, 1.2], with A = +1 and A = -1
    ratios = [0.5, 1.0, 1.1, 1.5, 0.5, 1.0, 0.9, 1.5]
    advs = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    loss, clipfrac, ppo_kl, grad = run_ppo(ratios, advs, eps_clip=0.2)
    # A>0: below -> unclipped (-0.5); above -> clipped at 1.2 (-1.2)
    # A<0: below -> clipped at 0.8 (0.8); above -> unclipped (1.5)
    assert loss.tolist() == pytest.approx([-0.5, -1.0, -1.1, -1.2, 0.8, 1.0, 0.9, 1.5])
    assert clipfrac.tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert ppo_kl.tolist() == pytest.approx([-math.log(r) for r in ratios])
    assert grad.tolist() == pytest.approx([-0.5, -1.0, -1.1, 0.0, 0.0, 1.0, 0.9, 1.5])
    for i, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        want = ref_ppo(r, a, 0.2)
        assert (loss[i].item(), clipfrac[i].item(), grad[i].item()) == pytest.approx(want)


def test_ppo_exact_boundary_counts_as_not_clipped():
    # ratios exactly 1 + eps_high and 1 - eps (float64-exact): clipped term == unclipped term,
    # clipfrac 0, gradient = unclipped gradient (-ratio * A).
    hi = torch.exp(torch.tensor(0.25, dtype=torch.float64)).item()
    lo = torch.exp(torch.tensor(-0.25, dtype=torch.float64)).item()
    eps_high, eps_low = hi - 1.0, 1.0 - lo
    assert 1.0 + eps_high == hi and 1.0 - eps_low == lo
    log_probs = torch.tensor([0.25, -0.25, 0.25, -0.25], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    loss, clipfrac, _ = policy_loss_ppo_clip(log_probs, torch.zeros(4, dtype=torch.float64), adv, eps_low, eps_high)
    loss.sum().backward()
    assert clipfrac.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert loss.tolist() == pytest.approx([-hi, lo, hi, -lo])
    assert log_probs.grad.tolist() == pytest.approx([-hi, lo, hi, -lo])
    # eps_clip = 0: every ratio of exactly 1 sits on both boundaries
    l0, c0, _ = policy_loss_ppo_clip(torch.zeros(2), torch.zeros(2), torch.tensor([1.0, -1.0]), 0.0)
    assert c0.tolist() == [0.0, 0.0] and l0.tolist() == [-1.0, 1.0]


def test_ppo_asymmetric_clip_higher():
    ratios = [1.25, 1.35, 0.75, 0.85]
    advs = [1.0, 1.0, -1.0, -1.0]
    loss, clipfrac, _, grad = run_ppo(ratios, advs, eps_clip=0.2, eps_clip_high=0.28)
    assert loss.tolist() == pytest.approx([-1.25, -1.28, 0.8, 0.85])
    assert clipfrac.tolist() == [0, 1, 1, 0]
    for i, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        assert (loss[i].item(), clipfrac[i].item(), grad[i].item()) == pytest.approx(ref_ppo(r, a, 0.2, 0.28))


def test_ppo_dual_clip_negative_advantages():
    ratios = [5.0, 2.0, 5.0, 0.5]
    advs = [-1.0, -1.0, 2.0, -2.0]
    loss, clipfrac, _, grad = run_ppo(ratios, advs, eps_clip=0.2, eps_clip_c=3.0)
    # r=5,A=-1: standard loss 5 > 3 -> 3 (grad 0); r=2,A=-1: 2 < 3 kept; A>0 untouched; r=.5,A=-2: 1.6
    assert loss.tolist() == pytest.approx([3.0, 2.0, -2.4, 1.6])
    assert grad.tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0])
    assert clipfrac.tolist() == [0, 0, 1, 1]
    for i, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        assert (loss[i].item(), clipfrac[i].item(), grad[i].item()) == pytest.approx(ref_ppo(r, a, 0.2, None, 3.0))
    with pytest.raises(ValueError, match="eps_clip_c"):
        policy_loss_ppo_clip(torch.zeros(1), torch.zeros(1), torch.ones(1), 0.2, eps_clip_c=1.0)


def test_ppo_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    n = 64
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    log_probs = old + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.6  # ratios ~[0.45, 2.2]
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    kw = dict(eps_clip=0.2, eps_clip_high=0.3, eps_clip_c=3.0)
    lp = log_probs.clone().requires_grad_(True)
    loss, _, _ = policy_loss_ppo_clip(lp, old, adv, **kw)
    loss.sum().backward()
    h = 1e-6
    for i in range(n):
        up, down = log_probs.clone(), log_probs.clone()
        up[i] += h
        down[i] -= h
        fd = (policy_loss_ppo_clip(up, old, adv, **kw)[0][i] - policy_loss_ppo_clip(down, old, adv, **kw)[0][i]) / (
            2 * h
        )
        assert lp.grad[i].item() == pytest.approx(fd.item(), abs=1e-6)
    # and the reduced loss through sum_of_sample_mean has no NaN gradient
    lp2 = log_probs.clone().requires_grad_(True)
    loss2, _, _ = policy_loss_ppo_clip(lp2, old, adv, **kw)
    total = reduce_loss(loss2, [32, 0, 32], [torch.ones(32), torch.ones(0), torch.zeros(32)])
    total.backward()
    assert torch.isfinite(lp2.grad).all() and (lp2.grad[32:] == 0).all()


def test_ppo_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        policy_loss_ppo_clip(torch.zeros(2), torch.zeros(3), torch.zeros(2), 0.2)
