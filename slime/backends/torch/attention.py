"""The attention of the trainer's transformers models: transformers' SDPA, with one exception.

Under `--bf16` on a CPU, torch's flash-attention kernel is slower in bfloat16 than in fp32 for short
rows: measured 2026-12-06 on an AMD EPYC with avx512_bf16 (2 threads, 8 heads of 64, forward and
backward): 26 positions 71 ms against 37 ms in fp32, 64 positions 76 against 50, 128: 93 against
66; from 256 positions on bfloat16 wins (96 against 103; 512: 38 against 45 ms; 2048: 151 against
209). RL batches are mostly short rows, where this made attention a third of a `--bf16` step of a
~25M model. So rows of at most `FP32_MAX_ROWS` positions (queries and keys) attend in fp32
(queries, keys and values in fp32, the output in bfloat16 as autocast's SDPA gives it: more exact,
not less); longer rows, other devices and fp32 runs go to transformers' SDPA unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "slime_sdpa"
FP32_MAX_ROWS = 256


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # (RoPE leaves queries and keys in fp32 under autocast; autocast then runs SDPA in bfloat16)
    in_bf16 = torch.bfloat16 in (query.dtype, value.dtype) or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )
    if query.device.type != "cpu" or not in_bf16 or max(query.shape[2], key.shape[2]) > FP32_MAX_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):  # autocast would send SDPA back to bfloat16
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(torch.bfloat16), weights


def install(model: torch.nn.Module) -> None:
    """Make `model` (a transformers model) attend through `_attention`, with SDPA's masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(NAME)
