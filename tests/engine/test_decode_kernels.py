"""The native decode step's C kernels against plain torch computations of the same formulas."""

from __future__ import annotations

import pytest
import torch

from slime.engine import kernels

K = kernels.load()
pytestmark = pytest.mark.skipif(K is None, reason="no C compiler: the torch path is used and tested instead")


def test_add_rms_norm_matches_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 96, generator=g)
    delta = torch.randn(7, 96, generator=g)
    w = torch.randn(96, generator=g)
    ref_x = x + delta
    ref = w * (ref_x * torch.rsqrt(ref_x.pow(2).mean(-1, keepdim=True) + 1e-6))
    out = K.add_rms_norm(x, delta, w, 1e-6)
    torch.testing.assert_close(x, ref_x, rtol=0, atol=0)  # the residual is added in place
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    plain = K.add_rms_norm(ref_x.clone(), None, w, 1e-5)
    torch.testing.assert_close(
        plain, w * (ref_x * torch.rsqrt(ref_x.pow(2).mean(-1, keepdim=True) + 1e-5)), rtol=1e-5, atol=1e-6
    )


def test_silu_mul_matches_torch():
    g = torch.Generator().manual_seed(1)
    gate, up = torch.randn(5, 300, generator=g) * 4, torch.randn(5, 300, generator=g)
    ref = torch.nn.functional.silu(gate) * up
    out = K.silu_mul(gate, up)
    assert out.data_ptr() == gate.data_ptr()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="shapes"):
        K.silu_mul(torch.zeros(3), torch.zeros(4))
    # the kernel's own exp: whole float range, no inf/nan (its input is clamped to [-87, 88])
    extreme = torch.tensor([-1e30, -200.0, -88.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 88.0, 200.0, 1e30])
    ref = torch.nn.functional.silu(extreme)
    out = K.silu_mul(extreme.clone(), torch.ones_like(extreme))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-8)


def test_rope_store_rotates_and_writes_the_new_position():
    g = torch.Generator().manual_seed(2)
    b, hq, hk, d, positions, cap = 6, 4, 2, 32, 50, 64
    q, k, v = torch.randn(b, hq, d, generator=g), torch.randn(b, hk, d, generator=g), torch.randn(b, hk, d, generator=g)
    angles = torch.rand(positions, d // 2, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    pos = torch.tensor([0, 3, 49, 7, 7, 20])
    keys, values = torch.zeros(b + 1, hk, cap // 16, d, 16), torch.zeros(b + 1, hk, cap, d)

    def rotate(x):
        c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
        return x * c + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1) * s

    rq, rk = rotate(q), rotate(k)
    K.rope_store(q, k, v, cos, sin, pos, keys, values)
    torch.testing.assert_close(q, rq, rtol=1e-6, atol=1e-6)
    want_k, want_v = torch.zeros_like(keys), torch.zeros_like(values)
    rows = torch.arange(b)
    want_k[rows, :, pos // 16, :, pos % 16] = rk
    want_v[rows, :, pos] = v
    torch.testing.assert_close(keys, want_k, rtol=1e-6, atol=1e-6)  # and nothing else written
    torch.testing.assert_close(values, want_v, rtol=0, atol=0)
    with pytest.raises(ValueError, match="do not fit"):
        K.rope_store(q, k[:, :1].contiguous(), v, cos, sin, pos, keys, values)


@pytest.mark.parametrize("group,d", [(1, 16), (4, 64), (7, 128), (2, 24)])
def test_decode_attention_matches_masked_softmax(group, d):
    """GQA groups of 1..7 query heads (AVX-512 blocks of 4 and their remainder), head dims that
    are and are not multiples of 16 (the vector path and the portable one)."""
    g = torch.Generator().manual_seed(3 + group)
    b, hk, cap = 5, 2, 48
    keys, values = torch.randn(b + 2, hk, cap, d, generator=g), torch.randn(b + 2, hk, cap, d, generator=g)
    keys[:, :, 40:] = float("nan")  # never read into a result: past every row's length
    q = torch.randn(b, hk * group, d, generator=g)
    lens = torch.tensor([0, 5, 39, 12, 1])  # row b sees positions 0..lens[b]
    blocked = keys.view(b + 2, hk, cap // 16, 16, d).transpose(-1, -2).contiguous()  # the pool's layout
    out = K.decode_attention(q, blocked, values, lens, 0.25)
    for row in range(b):
        n = int(lens[row]) + 1
        for h in range(hk * group):
            kv = h // group
            p = torch.softmax(keys[row, kv, :n] @ q[row, h] * 0.25, dim=-1)
            torch.testing.assert_close(out[row, h], p @ values[row, kv, :n], rtol=1e-5, atol=1e-5)


def test_wrappers_refuse_what_the_kernels_cannot_read():
    with pytest.raises(TypeError, match="float32"):
        K.silu_mul(torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        K.silu_mul(torch.zeros(4, 4).t(), torch.zeros(4, 4))
    with pytest.raises(IndexError, match="slots"):
        K.decode_attention(
            torch.zeros(3, 2, 8),
            torch.zeros(2, 2, 1, 8, 16),
            torch.zeros(2, 2, 16, 8),
            torch.zeros(3, dtype=torch.long),
            1.0,
        )
    with pytest.raises(ValueError, match="blocks of 16"):
        K.decode_attention(
            torch.zeros(2, 2, 8),
            torch.zeros(2, 2, 2, 8, 10),
            torch.zeros(2, 2, 20, 8),
            torch.zeros(2, dtype=torch.long),
            1.0,
        )


def test_build_is_cached_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_KERNEL_CACHE", str(tmp_path))
    first = kernels.build()
    assert first.parent == tmp_path and first.exists()
    mtime = first.stat().st_mtime_ns
    assert kernels.build() == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    with pytest.raises(RuntimeError, match="no C compiler"):
        kernels.build(cc="no-such-compiler-xyz")
