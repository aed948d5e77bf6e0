"""The algorithm suite (RLOO, REINFORCE++, GAE, whitening, GSPO, TIS, OPSM, value loss, unbiased KL,
OPD, DAPO overlong) against references computed here with plain loops / closed forms."""

import math

import pytest
import torch

from slime.algorithms.advantages import (
    dapo_overlong_penalty,
    gae_advantages_and_returns,
    masked_whiten,
    opd_penalize_advantages,
    ppo_token_rewards,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    rloo_rewards,
)
from slime.algorithms.kl import compute_approx_kl
from slime.algorithms.losses import (
    opsm_mask,
    policy_loss_ppo_clip,
    ppo_clip_from_kl,
    sequence_ppo_kl,
    tis_weights,
    value_loss_clipped,
)

# ------------------------------------------------------------------ RLOO


def ref_rloo(rewards, g):
    out = []
    for k in range(0, len(rewards), g):
        grp = rewards[k : k + g]
        for i, r in enumerate(grp):
            others = [x for j, x in enumerate(grp) if j != i]
            out.append(r - sum(others) / len(others) if others else 0.0)
    return out


@pytest.mark.parametrize("g", [1, 2, 4])
def test_rloo_is_leave_one_out_baseline(g):
    rewards = [1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 0.0, 1.0]
    got = rloo_rewards(torch.tensor(rewards), g)
    assert got.tolist() == pytest.approx(ref_rloo(rewards, g), abs=1e-6)


def test_rloo_equal_rewards_and_group_of_one_give_zero():
    assert rloo_rewards(torch.tensor([3.0, 3.0, 3.0]), 3).tolist() == [0.0, 0.0, 0.0]
    assert rloo_rewards(torch.tensor([5.0, -2.0]), 1).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------ REINFORCE++ and baseline


def ref_discounted(token_rewards, gamma):
    out, g = [0.0] * len(token_rewards), 0.0
    for t in reversed(range(len(token_rewards))):
        g = token_rewards[t] + gamma * g
        out[t] = g
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_returns(gamma):
    kl = [torch.tensor([0.1, -0.2, 0.3, 0.05]), torch.tensor([0.2, 0.1]), torch.tensor([]), torch.tensor([0.4, 0.1])]
    masks = [[1, 1, 1, 0], [1, 1], [], [0, 0]]  # trailing masked token; empty; fully masked
    rewards = [1.0, -0.5, 2.0, 3.0]
    got = reinforce_plus_plus_returns(rewards, kl, masks, kl_coef=0.5, gamma=gamma)
    # sample 0: the reward lands on the last *trained* token (index 2), not the masked tail
    tr0 = [-0.05, 0.1, -0.15 + 1.0, -0.025]
    assert got[0].tolist() == pytest.approx(ref_discounted(tr0, gamma), abs=1e-6)
    tr1 = [-0.1, -0.05 - 0.5]
    assert got[1].tolist() == pytest.approx(ref_discounted(tr1, gamma), abs=1e-6)
    assert got[2].numel() == 0
    assert got[3].tolist() == pytest.approx(ref_discounted([-0.2, -0.05], gamma), abs=1e-6)  # no reward placed


def test_reinforce_plus_plus_baseline_broadcasts_reward_minus_kl():
    kl = [torch.tensor([0.1, 0.2]), torch.tensor([0.0, 0.0, 0.3])]
    got = reinforce_plus_plus_baseline_advantages([0.5, -1.0], kl, kl_coef=0.1)
    assert got[0].tolist() == pytest.approx([0.49, 0.48])
    assert got[1].tolist() == pytest.approx([-1.0, -1.0, -1.03])


# ------------------------------------------------------------------ PPO token rewards and GAE


def ref_gae(rewards, values, gamma, lambd):
    n = len(rewards)
    adv = [0.0] * n
    for t in range(n):  # forward closed form: A_t = sum_k (gamma*lambd)^k delta_{t+k}
        s = 0.0
        for k in range(n - t):
            v_next = values[t + k + 1] if t + k + 1 < n else 0.0
            delta = rewards[t + k] + gamma * v_next - values[t + k]
            s += (gamma * lambd) ** k * delta
        adv[t] = s
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_gae_matches_closed_form(gamma, lambd):
    kl = [torch.tensor([0.1, 0.0, -0.2]), torch.tensor([0.3]), torch.tensor([])]
    token_r = ppo_token_rewards([1.0, -1.0, 0.5], kl, kl_coef=0.2)
    assert token_r[0].tolist() == pytest.approx([-0.02, 0.0, 0.04 + 1.0])
    assert token_r[1].tolist() == pytest.approx([-0.06 - 1.0])
    values = [torch.tensor([0.5, -0.3, 0.2]), torch.tensor([0.7]), torch.tensor([])]
    adv, ret = gae_advantages_and_returns(token_r, values, gamma, lambd)
    for r, v, a, rt in zip(token_r, values, adv, ret, strict=True):
        ra, rr = ref_gae(r.tolist(), v.tolist(), gamma, lambd)
        assert a.tolist() == pytest.approx(ra, abs=1e-6)
        assert rt.tolist() == pytest.approx(rr, abs=1e-6)


def test_gae_with_lambda_one_and_zero_values_is_monte_carlo_return():
    r = [torch.tensor([0.0, 0.0, 1.0])]
    adv, ret = gae_advantages_and_returns(r, [torch.zeros(3)], 1.0, 1.0)
    assert adv[0].tolist() == [1.0, 1.0, 1.0] and ret[0].tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------ whitening


def test_masked_whiten_uses_unbiased_masked_statistics():
    x = torch.tensor([1.0, 2.0, 100.0, 4.0, 7.0])
    m = torch.tensor([1, 1, 0, 1, 1])
    kept = [1.0, 2.0, 4.0, 7.0]
    mean = sum(kept) / 4
    var = sum((v - mean) ** 2 for v in kept) / 3
    got = masked_whiten(x, m)
    want = [(v - mean) / math.sqrt(var + 1e-8) for v in x.tolist()]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    no_shift = masked_whiten(x, m, shift_mean=False)
    assert no_shift.tolist() == pytest.approx([w + mean for w in want], rel=1e-6)


def test_masked_whiten_edge_cases_no_nan():
    x = torch.tensor([3.0, 3.0, 3.0])
    assert masked_whiten(x, torch.ones(3)).tolist() == [0.0, 0.0, 0.0]  # all equal: zero, not NaN
    assert masked_whiten(x, torch.zeros(3)).tolist() == [3.0, 3.0, 3.0]  # nothing trained: unchanged
    one = masked_whiten(torch.tensor([2.0, 9.0]), torch.tensor([1, 0]))
    assert torch.isfinite(one).all() and one[0] == 0.0


def test_masked_whiten_all_reduce_gives_global_statistics():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([4.0, 7.0])
    whole = masked_whiten(torch.cat([a, b]), torch.ones(4))
    sa = torch.stack([a.double().sum(), (a.double() ** 2).sum(), torch.tensor(2.0, dtype=torch.float64)])
    sb = torch.stack([b.double().sum(), (b.double() ** 2).sum(), torch.tensor(2.0, dtype=torch.float64)])
    left = masked_whiten(a, torch.ones(2), all_reduce_sum=lambda s: sa + sb)
    right = masked_whiten(b, torch.ones(2), all_reduce_sum=lambda s: sa + sb)
    assert torch.cat([left, right]).tolist() == pytest.approx(whole.tolist(), rel=1e-6)


# ------------------------------------------------------------------ GSPO


def test_gspo_sequence_ratio_and_gradient():
    lengths, masks = [3, 2, 0, 2], [[1, 1, 0], [1, 1], [], [0, 0]]
    new = torch.tensor([-1.0, -0.5, -3.0, -0.2, -0.4, -1.0, -2.0], requires_grad=True)
    old = torch.tensor([-1.2, -0.4, 0.0, -0.2, -0.6, -0.5, -0.5])
    kl = sequence_ppo_kl(new, old, lengths, masks)
    s0 = ((-1.2 + 1.0) + (-0.4 + 0.5)) / 2  # masked token excluded
    s1 = (0.0 + (-0.6 + 0.4)) / 2
    assert kl.tolist() == pytest.approx([s0] * 3 + [s1] * 2 + [0.0] * 2, abs=1e-6)
    adv = torch.tensor([1.0] * 3 + [-1.0] * 2 + [1.0] * 2)
    pg, clipfrac = ppo_clip_from_kl(kl, adv, 0.2)
    assert pg[:3].tolist() == pytest.approx([-math.exp(-s0)] * 3, rel=1e-6)
    assert clipfrac.sum() == 0
    # d/dnew_t of -exp(mean(new - old)) over sample 0's trained tokens: -ratio/2 on each, 0 on the masked one
    pg[:3].mean().backward()
    assert new.grad[:3].tolist() == pytest.approx([-math.exp(-s0) / 2, -math.exp(-s0) / 2, 0.0], rel=1e-5)


def test_ppo_clip_boundary_counts_as_unclipped_and_dual_clip():
    eps = 0.2
    # ratios exactly on the boundary -> equal terms -> not clipped
    ppo_kl = -torch.log(torch.tensor([1.2, 0.8, 1.5, 0.5, 3.0], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    pg, cf = ppo_clip_from_kl(ppo_kl, adv, eps, eps_clip_c=2.0)
    ratio = torch.exp(-ppo_kl)
    ref = []
    for r, a in zip(ratio.tolist(), adv.tolist(), strict=True):
        loss = max(-r * a, -min(max(r, 1 - eps), 1 + eps) * a)
        if a < 0:
            loss = min(loss, -2.0 * a)
        ref.append(loss)
    assert pg.tolist() == pytest.approx(ref, rel=1e-12)
    assert cf.tolist() == [0.0, 0.0, 1.0, 1.0, 0.0]  # ratio .5 with A<0: the clipped .8 wins
    assert pg[4] == pytest.approx(2.0)  # dual clip caps the ratio-3 negative-advantage loss at c*|A|
    # the old entry point agrees
    lp = torch.zeros(5, dtype=torch.float64)
    pg2, cf2, _ = policy_loss_ppo_clip(lp, ppo_kl, adv, eps, eps_clip_c=2.0)
    assert torch.equal(pg, pg2) and torch.equal(cf, cf2)


# ------------------------------------------------------------------ TIS


def test_tis_weights_clip_and_metrics():
    train = torch.tensor([0.0, 1.0, -1.0, -5.0])
    rollout = torch.tensor([0.0, 0.0, 0.0, 0.0])
    w, m = tis_weights(train, rollout, clip=2.0, clip_low=0.1)
    ratios = [1.0, math.e, math.exp(-1), math.exp(-5)]
    assert w.tolist() == pytest.approx([1.0, 2.0, math.exp(-1), 0.1], rel=1e-6)
    assert m["tis"].tolist() == pytest.approx(ratios, rel=1e-6)
    assert m["tis_clipfrac"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert m["tis_abs"].tolist() == pytest.approx([abs(r - 1) for r in ratios], rel=1e-6)
    assert not w.requires_grad


# ------------------------------------------------------------------ OPSM


def test_opsm_masks_only_negative_advantages_of_drifted_sequences():
    lengths, masks = [2, 2, 2, 1], [[1, 1], [1, 1], [1, 0], [0]]
    new = torch.tensor([-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    old = torch.tensor([-0.5, -0.5, -1.0, -1.0, -0.5, 5.0, 9.0])  # seq KL: .5, 0, .5 (masked tail ignored), 0
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    got = opsm_mask(new, old, adv, lengths, masks, delta=0.1)
    # sample 0 drifted: its negative-advantage token is dropped, the positive one kept;
    # sample 1 did not drift; sample 2 drifted: trained negative token dropped, masked one untouched.
    assert got.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]


# ------------------------------------------------------------------ value loss


def test_clipped_value_loss_matches_reference():
    v = torch.tensor([1.0, 0.0, 0.5, -1.0], requires_grad=True)
    old = torch.tensor([0.5, 0.0, 0.3, 0.0])
    ret = torch.tensor([2.0, 1.0, 0.0, -2.0])
    loss, cf = value_loss_clipped(v, old, ret, value_clip=0.2)
    ref = []
    for vi, oi, ri in zip(v.tolist(), old.tolist(), ret.tolist(), strict=True):
        clipped = oi + max(-0.2, min(0.2, vi - oi))
        ref.append(max((vi - ri) ** 2, (clipped - ri) ** 2))
    assert loss.tolist() == pytest.approx(ref, rel=1e-6)
    assert cf.tolist() == [1.0, 0.0, 0.0, 1.0]
    loss.sum().backward()
    # token 0: clipped term larger -> no gradient; token 2: |dv| = .2 (boundary), unclipped
    assert v.grad[0] == 0.0 and v.grad[2] == pytest.approx(2 * 0.5)


# ------------------------------------------------------------------ unbiased KL, OPD, DAPO overlong


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_unbiased_kl_is_importance_weighted(kind):
    lp = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-1.5, -0.5, -0.1])
    ratio = torch.tensor([1.2, 0.9, 1.0])
    plain = compute_approx_kl(lp, ref, kind)
    weighted = compute_approx_kl(lp, ref, kind, importance_ratio=ratio)
    assert weighted.tolist() == pytest.approx((plain * ratio).tolist(), rel=1e-6)


def test_opd_penalty_is_reverse_kl_on_sampled_tokens():
    adv = [torch.tensor([1.0, 1.0]), torch.tensor([-0.5])]
    student = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.1])]
    teacher = [[-0.5, -3.0], [-0.1]]
    new, rk = opd_penalize_advantages(adv, student, teacher, opd_kl_coef=0.5)
    assert rk[0].tolist() == pytest.approx([-0.5, 1.0]) and rk[1].tolist() == pytest.approx([0.0])
    assert new[0].tolist() == pytest.approx([1.25, 0.5]) and new[1].tolist() == pytest.approx([-0.5])


def test_dapo_overlong_penalty_piecewise_linear():
    got = dapo_overlong_penalty([0, 6, 7, 8, 10, 12], max_response_len=10, buffer_len=4, penalty_factor=0.5)
    # expected length 6: no penalty up to 6, then -(len-6)/4*0.5, capped at -0.5
    assert got == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError):
        dapo_overlong_penalty([1], max_response_len=4, buffer_len=5)
