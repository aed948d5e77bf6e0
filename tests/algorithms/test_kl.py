"""KL estimators against closed forms computed per element in Python."""

import math

import pytest
import torch

from slime.algorithms.kl import KL_TYPES, compute_approx_kl

LP = [-0.5, -2.0, -1.0, -0.1, -30.0]
REF = [-1.0, -1.0, -1.0, -0.3, -0.5]


def ref(kind, lp, rp):
    d = lp - rp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    k3 = math.exp(-d) - 1 + d
    if kind == "low_var_kl":
        return min(max(k3, -10.0), 10.0)
    return k3


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_each_type_matches_closed_form(kind):
    got = compute_approx_kl(torch.tensor(LP), torch.tensor(REF), kind)
    want = [ref(kind, a, b) for a, b in zip(LP, REF, strict=True)]
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(want, rel=1e-5)


def test_k3_unclamped_low_var_clamped():
    # log_ratio = -29.5: exp(29.5) is huge for k3, clamped to 10 for low_var_kl
    k3 = compute_approx_kl(torch.tensor([-30.0]), torch.tensor([-0.5]), "k3")
    lv = compute_approx_kl(torch.tensor([-30.0]), torch.tensor([-0.5]), "low_var_kl")
    assert k3.item() > 1e12
    assert lv.item() == 10.0


def test_zero_when_equal_and_k3_nonnegative():
    x = torch.linspace(-3, 0, 7)
    for kind in KL_TYPES:
        assert torch.allclose(compute_approx_kl(x, x, kind), torch.zeros(7))
    y = torch.linspace(-2, -0.1, 7)
    assert (compute_approx_kl(x, y, "k3") >= 0).all()


def test_half_precision_computed_in_fp32():
    got = compute_approx_kl(
        torch.tensor([-0.5], dtype=torch.bfloat16), torch.tensor([-1.0], dtype=torch.bfloat16), "k2"
    )
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(0.125)


def test_unknown_type_lists_valid():
    assert KL_TYPES == ("k1", "k2", "k3", "low_var_kl")
    with pytest.raises(ValueError) as e:
        compute_approx_kl(torch.zeros(1), torch.zeros(1), "k4")
    for kind in KL_TYPES:
        assert kind in str(e.value)
