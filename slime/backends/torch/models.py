"""The Hugging Face models a training rank holds, loaded, sharded and read back whole.

One rank is a plain module; several ranks shard each decoder layer and the model with FSDP2
`fully_shard` over the gloo (or NCCL) process group, so scaling out is a configuration change.
"""

from __future__ import annotations

from argparse import Namespace

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from slime.backends.torch import attention, lora


def load_policy(path: str, device: torch.device, recompute: bool) -> torch.nn.Module:
    """The policy in fp32 (the master weights) on `device`, in train mode; `recompute`: Megatron's
    --recompute-*, activations recomputed in the backward pass."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    attention.install(model)
    if device.type != "cpu":  # fp32 master weights on the rank's GPU (before sharding)
        model.to(device)
    model.train()
    model.config.use_cache = False
    if recompute:
        enable_activation_checkpointing(model)
    return model


def load_frozen(path: str, device: torch.device) -> torch.nn.Module:
    """A model that never trains (reference, old actor, teacher), unsharded on each rank."""
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    attention.install(m)
    return m.to(device) if device.type != "cpu" else m


def load_frozen_models(
    args: Namespace, device: torch.device, policy: torch.nn.Module
) -> tuple[torch.nn.Module | None, torch.nn.Module | None, torch.nn.Module | None]:
    """(reference, OPD teacher, old actor), each None when the run does not use it: the reference
    for a KL loss or KL in the reward (with LoRA, the policy with its adapter off: no copy), the
    teacher for `--opd-type megatron`, the old actor (`--keep-old-actor`) holding the weights the
    engines serve while the policy drifts from them."""
    ref = None
    if args.use_kl_loss or args.kl_coef != 0.0:
        ref = lora.ReferenceView(policy) if lora.is_lora(policy) else load_frozen(args.ref_load, device)
    teacher = load_frozen(args.opd_teacher_load, device) if (args.use_opd and args.opd_type == "megatron") else None
    old_actor = load_frozen(args.hf_checkpoint, device) if args.keep_old_actor else None
    return ref, teacher, old_actor


def shard(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute every decoder layer's activations in the backward pass (non-reentrant, FSDP2-safe)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def full_state(model: torch.nn.Module, world_size: int, merge: bool = True) -> dict[str, torch.Tensor]:
    """Full, unsharded weights (a collective when sharded, gathered to the host; every rank must call).
    A LoRA policy's are the plain model's, the adapter merged, unless `merge` is False."""
    if world_size == 1:
        state = {k: v.detach() for k, v in model.state_dict().items()}
    else:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return lora.merged(state, lora.scaling(model)) if merge and lora.is_lora(model) else state


def full_state_every_rank(model: torch.nn.Module, world_size: int) -> dict[str, torch.Tensor]:
    """Full weights on every rank, copied (what the frozen copies load; a LoRA policy's merged)."""
    if world_size == 1:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    else:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return lora.merged(state, lora.scaling(model)) if lora.is_lora(model) else state
