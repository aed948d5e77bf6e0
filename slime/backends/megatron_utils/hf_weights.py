"""Hugging Face (Qwen2 / Llama layout) weights <-> a megatron-core GPTModel's, tensor-parallel.

Megatron keeps per layer one fused QKV projection, grouped by key/value head: for each group its
query heads, then its key head, then its value head (so a tensor-parallel rank holds whole
groups), and one fused first MLP projection [gate; up] per rank. Column-parallel weights (QKV,
fc1, the embedding and output layer, split over the vocabulary) are split along their output
dimension, row-parallel ones (the attention output, fc2) along their input dimension; norms are
whole on every rank.

`to_megatron` cuts a rank's shard from the full HF tensors; `to_hf` gathers every rank's shards
(a collective over the tensor-parallel group) and gives back the HF names and tensors exactly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

Tensor = torch.Tensor


def _layer(i: int) -> tuple[str, str]:
    return f"model.layers.{i}.", f"decoder.layers.{i}."


def to_megatron(hf: dict[str, Tensor], config: Any, tp_rank: int, tp_size: int, tied: bool) -> dict[str, Tensor]:
    """The Megatron state of tensor-parallel rank `tp_rank` from a full HF state dict."""
    heads, groups, d = config.num_attention_heads, config.num_query_groups, config.kv_channels
    per_group = heads // groups

    def cols(t: Tensor) -> Tensor:
        return t.chunk(tp_size, dim=0)[tp_rank].clone()

    def rows(t: Tensor) -> Tensor:
        return t.chunk(tp_size, dim=1)[tp_rank].clone()

    out = {"embedding.word_embeddings.weight": cols(hf["model.embed_tokens.weight"])}
    for i in range(config.num_layers):
        h, m = _layer(i)
        a = h + "self_attn."
        q = hf[a + "q_proj.weight"].reshape(groups, per_group * d, -1)
        k, v = (hf[a + f"{n}_proj.weight"].reshape(groups, d, -1) for n in ("k", "v"))
        qkv = torch.cat([q, k, v], dim=1)  # [groups, (per_group + 2)·d, hidden]
        out[m + "self_attention.linear_qkv.weight"] = cols(qkv).reshape(-1, qkv.shape[-1])
        if config.add_qkv_bias:
            qb = hf[a + "q_proj.bias"].reshape(groups, per_group * d)
            kb, vb = (hf[a + f"{n}_proj.bias"].reshape(groups, d) for n in ("k", "v"))
            out[m + "self_attention.linear_qkv.bias"] = cols(torch.cat([qb, kb, vb], dim=1)).reshape(-1)
        out[m + "self_attention.linear_proj.weight"] = rows(hf[a + "o_proj.weight"])
        gate, up = cols(hf[h + "mlp.gate_proj.weight"]), cols(hf[h + "mlp.up_proj.weight"])
        out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[m + "mlp.linear_fc2.weight"] = rows(hf[h + "mlp.down_proj.weight"])
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"].clone()
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
    if not tied:
        out["output_layer.weight"] = cols(hf["lm_head.weight"])
    return out


def _gather(t: Tensor, dim: int, tp_size: int, group: Any) -> Tensor:
    if tp_size == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(tp_size)]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def to_hf(meg: dict[str, Tensor], config: Any, tp_size: int, group: Any, tied: bool) -> dict[str, Tensor]:
    """The full HF state dict from every tensor-parallel rank's Megatron state (every rank calls)."""
    heads, groups, d = config.num_attention_heads, config.num_query_groups, config.kv_channels
    per_group = heads // groups
    hidden = config.hidden_size

    def cols(name: str) -> Tensor:
        return _gather(meg[name], 0, tp_size, group)

    def rows(name: str) -> Tensor:
        return _gather(meg[name], 1, tp_size, group)

    out = {"model.embed_tokens.weight": cols("embedding.word_embeddings.weight")}
    for i in range(config.num_layers):
        h, m = _layer(i)
        a = h + "self_attn."
        qkv = cols(m + "self_attention.linear_qkv.weight").reshape(groups, (per_group + 2) * d, hidden)
        q, k, v = qkv.split([per_group * d, d, d], dim=1)
        out[a + "q_proj.weight"] = q.reshape(-1, hidden)
        out[a + "k_proj.weight"], out[a + "v_proj.weight"] = k.reshape(-1, hidden), v.reshape(-1, hidden)
        if config.add_qkv_bias:
            qkv_b = cols(m + "self_attention.linear_qkv.bias").reshape(groups, (per_group + 2) * d)
            qb, kb, vb = qkv_b.split([per_group * d, d, d], dim=1)
            out[a + "q_proj.bias"], out[a + "k_proj.bias"], out[a + "v_proj.bias"] = (
                qb.reshape(-1),
                kb.reshape(-1),
                vb.reshape(-1),
            )
        out[a + "o_proj.weight"] = rows(m + "self_attention.linear_proj.weight")
        # each rank's fc1 shard is [gate shard; up shard]
        fc1 = meg[m + "mlp.linear_fc1.weight"]
        gate, up = fc1.chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"] = _gather(gate, 0, tp_size, group)
        out[h + "mlp.up_proj.weight"] = _gather(up, 0, tp_size, group)
        out[h + "mlp.down_proj.weight"] = rows(m + "mlp.linear_fc2.weight")
        out[h + "input_layernorm.weight"] = meg[m + "input_layernorm.weight"].detach().clone()
        out[h + "post_attention_layernorm.weight"] = meg[m + "pre_mlp_layernorm.weight"].detach().clone()
    out["model.norm.weight"] = meg["decoder.final_layernorm.weight"].detach().clone()
    out["lm_head.weight"] = out["model.embed_tokens.weight"] if tied else cols("output_layer.weight")
    return out


def load_hf_weights(
    model: torch.nn.Module,
    hf: dict[str, Tensor],
    tp_rank: int,
    tp_size: int,
    tied: bool,
    extra: dict[str, Tensor] | None = None,
) -> None:
    """Copy a full HF state dict into this rank's GPTModel (every parameter must be covered; `extra`:
    Megatron-named weights of modules HF's causal LM does not have, e.g. the critic's value head)."""
    state = {**to_megatron(hf, model.config, tp_rank, tp_size, tied), **(extra or {})}
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state))
    unknown = sorted(set(state) - set(params))
    if missing or unknown:
        raise ValueError(f"HF -> Megatron names differ: missing {missing[:3]}, unknown {unknown[:3]}")
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != state[name].shape:
                raise ValueError(f"{name}: Megatron shape {tuple(p.shape)}, converted {tuple(state[name].shape)}")
            p.copy_(state[name])
