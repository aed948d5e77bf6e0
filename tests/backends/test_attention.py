"""The trainer's attention (`slime.backends.torch.attention`): transformers' SDPA unchanged in fp32
and for long rows; under bf16 autocast on the CPU, short rows attend in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slime.backends.torch import attention
from slime.backends.torch.models import load_frozen, load_policy


def _qkv(rows: int, keys: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rows)
    q, k, v = (torch.randn(3, 4, n, 16, generator=g) for n in (rows, keys, keys))
    return q, k.to(dtype), v.to(dtype)  # as in the model under autocast: RoPE'd keys fp32, values bf16


class _Module(torch.nn.Module):
    is_causal = True


def test_fp32_is_transformers_sdpa_bit_for_bit():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv(12, 12)
    got, _ = attention._attention(_Module(), q, k, v, None, scaling=0.25)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_short_rows_under_bf16_autocast_attend_in_fp32():
    q, k, v = _qkv(12, 12, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = attention._attention(_Module(), q, k, v, None, scaling=0.25)
        plain = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)  # autocast: bf16
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, scale=0.25)
    fp32 = F.scaled_dot_product_attention(q, k.float(), v.float(), is_causal=True, scale=0.25)
    assert got.dtype == plain.dtype == torch.bfloat16  # what autocast's SDPA hands on
    assert torch.equal(got, fp32.transpose(1, 2).to(torch.bfloat16))  # transformers' layout: [b, s, h, d]
    # closer to the exact attention than bfloat16 SDPA (on average: only the output's rounding is left)
    err = (got.double() - exact.transpose(1, 2)).abs().mean()
    assert err < (plain.transpose(1, 2).double() - exact.transpose(1, 2)).abs().mean()


def test_long_rows_keep_bf16_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv(attention.FP32_MAX_ROWS + 1, attention.FP32_MAX_ROWS + 1, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = attention._attention(_Module(), q, k, v, None, scaling=0.25)
        want, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    assert torch.equal(got, want)


def test_the_trainers_models_use_it_and_fp32_logits_are_unchanged(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    policy = load_policy(str(tiny_model_dir), torch.device("cpu"), recompute=False)
    frozen = load_frozen(str(tiny_model_dir), torch.device("cpu"))
    assert policy.config._attn_implementation == frozen.config._attn_implementation == attention.NAME
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert plain.config._attn_implementation == "sdpa"
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        assert torch.equal(
            frozen(input_ids=ids, attention_mask=mask).logits, plain(input_ids=ids, attention_mask=mask).logits
        )
