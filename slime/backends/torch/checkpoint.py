"""The trainer's checkpoints: Hugging Face model files plus the state needed to resume
(layout in `slime.utils.checkpoint_layout`; the rollout side writes its own state file beside)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)
from transformers import AutoTokenizer

from slime.errors import SlimeError
from slime.utils.checkpoint_layout import TRACKER, TRAINER_STATE_FILE, iter_dir, latest_dir

CRITIC_STATE_FILE = "critic_state.pt"


class Checkpointable(Protocol):
    """What a checkpoint reads from and restores into (a `TrainActor`)."""

    args: Namespace
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic: Any
    world_size: int

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    def is_rank0(self) -> bool: ...


def save(actor: Checkpointable, rollout_id: int) -> str:
    out = iter_dir(actor.args.save, rollout_id)
    model_state = actor.full_state_dict()
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim_state = get_optimizer_state_dict(actor.model, actor.optimizer, options=opts)
    critic_state = actor.critic.state() if actor.critic is not None else None
    if actor.is_rank0():
        out.mkdir(parents=True, exist_ok=True)
        actor.model.save_pretrained(out, state_dict=model_state, safe_serialization=True)
        AutoTokenizer.from_pretrained(actor.args.hf_checkpoint).save_pretrained(out)
        torch.save({"optimizer": optim_state, "rollout_id": rollout_id, "scheduler": actor.scheduler.state_dict(),
                    "rng": torch.get_rng_state()}, out / TRAINER_STATE_FILE)
        if critic_state is not None:  # value head + backbone + its optimizer, to resume PPO
            torch.save(critic_state, out / CRITIC_STATE_FILE)
        (Path(actor.args.save) / TRACKER).write_text(f"{rollout_id}\n")
    if actor.world_size > 1:
        dist.barrier()
    return str(out)


def load(actor: Checkpointable, load_path: str) -> int:
    """Restore weights and optimizer from `--load`; return the next rollout id."""
    ckpt = latest_dir(load_path)
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if not weights:
        raise SlimeError(f"--load {load_path}: no *.safetensors in {ckpt}")
    state = torch.load(ckpt / TRAINER_STATE_FILE, map_location="cpu", weights_only=False)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(actor.model, weights, options=opts)
    set_optimizer_state_dict(actor.model, actor.optimizer, state["optimizer"], options=opts)
    torch.set_rng_state(state["rng"])
    if "scheduler" in state:
        actor.scheduler.load_state_dict(state["scheduler"])
    if actor.critic is not None and (ckpt / CRITIC_STATE_FILE).exists():
        actor.critic.load_state(torch.load(ckpt / CRITIC_STATE_FILE, map_location="cpu", weights_only=False))
    return int(state["rollout_id"]) + 1
