"""GRPO / Dr.GRPO advantages against plain-Python references."""

import math

import pytest
import torch

from slime.algorithms.advantages import expand_to_tokens, group_normalize_rewards


def ref_grpo(rewards, g, std_norm=True, eps=1e-6):
    out = []
    for k in range(0, len(rewards), g):
        grp = rewards[k : k + g]
        mean = sum(grp) / len(grp)
        if len(grp) > 1:
            std = math.sqrt(sum((r - mean) ** 2 for r in grp) / (len(grp) - 1))  # unbiased, like torch.std
        else:
            std = 0.0
        for r in grp:
            out.append((r - mean) / (std + eps) if std_norm else r - mean)
    return out


def test_grpo_matches_reference_unbiased_std():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 2.0, -1.0]
    got = group_normalize_rewards(torch.tensor(rewards), group_size=4)
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(ref_grpo(rewards, 4), rel=1e-5, abs=1e-6)
    # closed form for the first group {1,0,0,1}: mean .5, unbiased std sqrt(1/3)
    assert got[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6), rel=1e-6)


def test_grpo_std_is_unbiased_not_population():
    got = group_normalize_rewards(torch.tensor([0.0, 2.0]), group_size=2, eps=0.0)
    # population std = 1 would give +-1; unbiased std = sqrt(2) gives +-1/sqrt(2)
    assert got.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_group_of_one_is_zero_not_nan():
    got = group_normalize_rewards(torch.tensor([3.0, -1.0, 0.5]), group_size=1)
    assert torch.equal(got, torch.zeros(3))
    got = group_normalize_rewards(torch.tensor([3.0, -1.0]), group_size=1, std_normalization=False)
    assert torch.equal(got, torch.zeros(2))


def test_all_equal_rewards_give_zero():
    got = group_normalize_rewards(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), group_size=3)
    assert torch.isfinite(got).all()
    assert torch.equal(got, torch.zeros(6))


def test_dr_grpo_mean_only():
    rewards = [1.0, 0.0, 0.0, 0.0, 5.0, 7.0]
    got = group_normalize_rewards(rewards, group_size=3, std_normalization=False)
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -4, 1, 3], abs=1e-6)
    assert got.tolist() == pytest.approx(ref_grpo(rewards, 3, std_norm=False), abs=1e-6)


def test_float64_kept_and_int_rewards_accepted():
    assert group_normalize_rewards(torch.tensor([1.0, 0.0], dtype=torch.float64), 2).dtype == torch.float64
    got = group_normalize_rewards(torch.tensor([1, 0, 1, 1]), 2)
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(ref_grpo([1, 0, 1, 1], 2), abs=1e-6)


def test_bad_group_size_raises():
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        group_normalize_rewards(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        group_normalize_rewards(torch.zeros(4), group_size=0)
    with pytest.raises(ValueError, match="1-D"):
        group_normalize_rewards(torch.zeros(2, 2), group_size=2)


def test_expand_to_tokens():
    out = expand_to_tokens(torch.tensor([0.5, -1.0, 2.0]), [3, 0, 2])
    assert [t.tolist() for t in out] == [[0.5, 0.5, 0.5], [], [2.0, 2.0]]
    out[0][0] = 9.0  # independent storage, not a view of the input
    assert out[0].tolist() == [9.0, 0.5, 0.5]
    with pytest.raises(ValueError):
        expand_to_tokens(torch.tensor([1.0]), [1, 2])
