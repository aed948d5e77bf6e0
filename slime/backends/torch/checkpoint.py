"""Checkpoints: Hugging Face model files plus the trainer state needed to resume.

Layout (Megatron-style tracker file, so `--load` finds the newest):
    <save>/iter_0000012/   config.json, model.safetensors, tokenizer files  (loads with transformers)
                           trainer_state.pt   (optimizer, rollout id, RNG)
                           rollout_state.json (data source position; written by the rollout side)
    <save>/latest_checkpointed_iteration.txt
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from slime.errors import SlimeError

if TYPE_CHECKING:
    from slime.backends.torch.actor import TrainActor

TRACKER = "latest_checkpointed_iteration.txt"


def iter_dir(save: str | os.PathLike, rollout_id: int) -> Path:
    return Path(save) / f"iter_{rollout_id:07d}"


def latest_dir(load: str | os.PathLike) -> Path:
    """The checkpoint directory `--load` points at (the tracker's newest, or `load` itself)."""
    load = Path(load)
    tracker = load / TRACKER
    if tracker.exists():
        return iter_dir(load, int(tracker.read_text().strip()))
    if (load / "trainer_state.pt").exists():
        return load
    raise SlimeError(f"--load {load}: no {TRACKER} and no trainer_state.pt there")


def save(actor: "TrainActor", rollout_id: int) -> str:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from transformers import AutoTokenizer

    out = iter_dir(actor.args.save, rollout_id)
    model_state = actor.full_state_dict()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim_state = get_optimizer_state_dict(actor.model, actor.optimizer, options=opts)
    critic_state = actor.critic.state() if actor.critic is not None else None
    if actor.is_rank0():
        out.mkdir(parents=True, exist_ok=True)
        module = actor.model
        module.save_pretrained(out, state_dict=model_state, safe_serialization=True)
        AutoTokenizer.from_pretrained(actor.args.hf_checkpoint).save_pretrained(out)
        torch.save({"optimizer": optim_state, "rollout_id": rollout_id, "scheduler": actor.scheduler.state_dict(),
                    "rng": torch.get_rng_state()}, out / "trainer_state.pt")
        if critic_state is not None:  # value head + backbone + its optimizer, to resume PPO
            torch.save(critic_state, out / "critic_state.pt")
        (Path(actor.args.save) / TRACKER).write_text(f"{rollout_id}\n")
    if actor.world_size > 1:
        dist.barrier()
    return str(out)


def load(actor: "TrainActor", load_path: str) -> int:
    """Restore weights and optimizer from `--load`; return the next rollout id."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, set_model_state_dict, set_optimizer_state_dict,
    )

    ckpt = latest_dir(load_path)
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if not weights:
        raise SlimeError(f"--load {load_path}: no *.safetensors in {ckpt}")
    state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(actor.model, weights, options=opts)
    set_optimizer_state_dict(actor.model, actor.optimizer, state["optimizer"], options=opts)
    torch.set_rng_state(state["rng"])
    if "scheduler" in state:
        actor.scheduler.load_state_dict(state["scheduler"])
    if actor.critic is not None and (ckpt / "critic_state.pt").exists():
        actor.critic.load_state(torch.load(ckpt / "critic_state.pt", map_location="cpu", weights_only=False))
    return int(state["rollout_id"]) + 1
