"""The policy as a megatron-core `GPTModel`, built from a Hugging Face checkpoint's config.

A Qwen2 / Llama-style decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, QKV bias as the
config says) with Megatron's local layer spec (plain torch modules: no TransformerEngine on a
CPU). Every fusion is off: they are CUDA kernels. The weights come from the HF checkpoint
(`hf_weights.load_hf_weights`), not from Megatron's initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from slime.errors import SlimeError

SUPPORTED = ("qwen2", "llama")  # model types whose HF layout `hf_weights` converts


@dataclass(frozen=True)
class Layout:
    """How the model is split and what the backward recomputes (slime's Megatron options)."""

    tensor_parallel: int = 1
    sequence_parallel: bool = False  # --sequence-parallel: activations between the layers split along the sequence
    recompute_granularity: str | None = None  # --recompute-granularity full | selective
    recompute_method: str | None = None  # --recompute-method uniform | block
    recompute_num_layers: int | None = None  # --recompute-num-layers

    @classmethod
    def of(cls, args: Any) -> Layout:
        return cls(
            args.tensor_model_parallel_size,
            bool(args.sequence_parallel) and args.tensor_model_parallel_size > 1,  # Megatron: SP needs TP > 1
            args.recompute_granularity,
            args.recompute_method,
            args.recompute_num_layers,
        )


class RMSNorm:
    """torch's RMSNorm for Megatron's layer spec, as its WrappedTorchNorm, but usable with sequence
    parallelism: the weight is marked `sequence_parallel`, so Megatron sums its gradient over the
    tensor-parallel ranks (each saw only its part of the sequence). WrappedTorchNorm refuses the
    option because it does not mark it."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        norm.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return norm


def transformer_config(hf: Any, layout: Layout, params_dtype: torch.dtype = torch.float32) -> Any:
    """Megatron's TransformerConfig for the HF config `hf` (a PretrainedConfig)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if hf.model_type not in SUPPORTED:
        raise SlimeError(
            f"--train-backend megatron: model type {hf.model_type!r} is not converted here (supported: "
            f"{', '.join(SUPPORTED)})"
        )
    tensor_parallel = layout.tensor_parallel
    heads, groups = hf.num_attention_heads, hf.num_key_value_heads or hf.num_attention_heads
    if groups % tensor_parallel or heads % tensor_parallel:
        raise SlimeError(
            f"--tensor-model-parallel-size {tensor_parallel} must divide the model's {heads} attention heads "
            f"and {groups} key/value heads"
        )
    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        ffn_hidden_size=hf.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=bool(getattr(hf, "attention_bias", hf.model_type == "qwen2")),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel,
        sequence_parallel=layout.sequence_parallel,
        recompute_granularity=layout.recompute_granularity,
        recompute_method=layout.recompute_method,
        recompute_num_layers=layout.recompute_num_layers,
        params_dtype=params_dtype,
        use_cpu_initialization=True,
        # initialised although the checkpoint's weights replace them: with CPU initialisation only that
        # path marks a weight tensor-parallel, and without the mark the gradient norm counts the
        # split weights on the first rank alone
        perform_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )


def rope_theta(hf: Any) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    scaling = params.get("rope_type", "default")
    if scaling != "default":
        raise SlimeError(f"--train-backend megatron: RoPE scaling {scaling!r} is not supported, only plain RoPE")
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def build_gpt_model(hf: Any, layout: Layout, params_dtype: torch.dtype = torch.float32) -> Any:
    """A GPTModel shaped like the HF config (weights not loaded yet); parallel state must be set up."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    config = transformer_config(hf, layout, params_dtype)
    if hf.vocab_size % layout.tensor_parallel:
        raise SlimeError(
            f"--tensor-model-parallel-size {layout.tensor_parallel} must divide the vocabulary ({hf.vocab_size} tokens)"
        )
    layer = get_gpt_layer_local_spec(normalization="RMSNorm")
    layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = RMSNorm
    return GPTModel(
        config,
        TransformerBlockSubmodules(layer_specs=[layer] * config.num_layers, layer_norm=RMSNorm),
        vocab_size=hf.vocab_size,
        max_sequence_length=hf.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf),
        share_embeddings_and_output_weights=bool(hf.tie_word_embeddings),
    )


class LinearForLastLayer(torch.nn.Linear):
    """The critic's value head in place of the GPTModel's output layer (slime's name): hidden -> 1,
    whole on every tensor-parallel rank, fp32 out. With sequence parallelism each rank sees part of
    the sequence, so the weights are marked for Megatron to sum their gradients over the ranks and
    the values are gathered back along the sequence."""

    def __init__(self, hidden_size: int, config: Any) -> None:
        super().__init__(hidden_size, 1)
        self.sequence_parallel = config.sequence_parallel
        for p in (self.weight, self.bias):
            p.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None) -> tuple:
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        values = super().forward(hidden).float()  # [s (/ tp with SP), b, 1]
        if self.sequence_parallel:
            values = gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


def build_value_model(hf: Any, layout: Layout) -> Any:
    """The critic: a GPTModel shaped like the HF config with a value head as its output layer (the
    embedding never tied to it); weights not loaded yet."""
    untied = type(hf).from_dict({**hf.to_dict(), "tie_word_embeddings": False})
    model = build_gpt_model(untied, layout)
    model.output_layer = LinearForLastLayer(hf.hidden_size, model.config)
    return model
