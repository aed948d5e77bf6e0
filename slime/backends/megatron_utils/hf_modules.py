"""Megatron GPTModels answering as the fsdp trainer's modules do, so its batching, losses and the
critic's value pass run on them unchanged: `MegatronCausalLM` (`model(input_ids=...).logits`) for
the policy and its frozen copies, `MegatronValueModel` (`model(input_ids=...)` -> values) for the
critic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from slime.backends.megatron_utils import model as megatron_model
from slime.backends.megatron_utils.model_provider import Layout


class MegatronCausalLM(torch.nn.Module):
    """A GPTModel answering as a transformers causal LM does (`model(input_ids=...).logits`, the
    vocabulary gathered whole over the tensor-parallel ranks), so the FSDP path's batching and
    losses run on it. Right-padded micro-batches: Megatron's causal mask keeps padding out of every
    real token's attention. Packed ones (`--use-dynamic-batch-size`: samples in one row, a
    block-diagonal causal mask): the mask is handed to Megatron's attention; RoPE then counts
    positions along the row rather than from each sample's start, which changes no attention score
    (rotary embeddings depend on the distance between two positions only, and the mask keeps each
    token inside its own sample). With sequence parallelism Megatron splits the sequence over the
    tensor-parallel ranks, so a row is padded at its end to a multiple of their number (causal
    attention keeps the padding out of every real token's)."""

    def __init__(self, gpt: Any, hf_config: Any, chunk: Any = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.config = hf_config  # what the batching reads of a model (pad token, dropout: Megatron's is 0)
        # what slime's Megatron hooks get as the rank's model chunk: a trained model's DDP wrapper, a
        # frozen copy's GPTModel (in a tuple: not a submodule, so the state dict holds each weight once)
        self._chunk = (chunk if chunk is not None else gpt,)

    @property
    def megatron_chunk(self) -> Any:
        return self._chunk[0]

    def outputs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """What the GPTModel's output layer gives for each input position, [b, s, ...] (this rank's
        share of the vocabulary for the policy)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        # Megatron masks where True; the batching's 4-D mask (packed rows) is True where a token attends
        mask = ~attention_mask if attention_mask is not None and attention_mask.dim() == 4 else None
        length, config = input_ids.shape[1], self.gpt.config
        extra = -length % config.tensor_model_parallel_size if config.sequence_parallel else 0
        if extra:
            input_ids = torch.nn.functional.pad(input_ids, (0, extra))
            position_ids = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, extra + 1)], dim=1)
            if mask is not None:  # the padding attends nowhere and nothing attends to it
                mask = torch.nn.functional.pad(mask, (0, extra, 0, extra), value=True)
        return self.gpt(input_ids, position_ids, mask)[:, :length]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> SimpleNamespace:
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        logits = self.outputs(input_ids, attention_mask, position_ids)  # [b, s, vocab / tp]
        return SimpleNamespace(logits=gather_from_tensor_model_parallel_region(logits))

    def save_pretrained(self, out: Any, state_dict: dict[str, torch.Tensor], safe_serialization: bool = True) -> None:
        """`state_dict` (transformers' names) as a Hugging Face model directory's config and weights."""
        from safetensors.torch import save_file

        self.config.save_pretrained(out)
        if self.config.tie_word_embeddings:  # transformers ties it back on load; safetensors refuses shared storage
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        save_file({k: v.contiguous() for k, v in state_dict.items()}, f"{out}/model.safetensors", {"format": "pt"})

    @classmethod
    def frozen(cls, hf_config: Any, hf_state: dict[str, torch.Tensor], layout: Layout) -> MegatronCausalLM:
        """A copy that never trains (reference, old actor, OPD teacher)."""
        return cls(megatron_model.build_frozen(hf_config, hf_state, layout), hf_config).eval()

    @classmethod
    def frozen_from(cls, path: str, layout: Layout) -> MegatronCausalLM:
        return cls.frozen(*megatron_model.read_hf(path), layout)


class MegatronValueModel(MegatronCausalLM):
    """The critic's GPTModel (value head as its output layer) answering as the fsdp critic's
    `ValueModel`: `model(input_ids=...)` -> the value of every position, [b, s] (fp32)."""

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.outputs(input_ids, attention_mask, position_ids).squeeze(-1)
