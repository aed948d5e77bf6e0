"""The trainer's checkpoints: Hugging Face model files plus the state needed to resume
(layout in `slime.utils.checkpoint_layout`; the rollout side writes its own state file beside).

`--no-save-optim` (slime's, Megatron's meaning) leaves the optimizer states out (policy and
critic); the LR schedule's position, RNG and rollout id are still saved. Loading such a
checkpoint starts a fresh optimizer and says so.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)
from transformers import AutoTokenizer

from slime.errors import SlimeError
from slime.utils.checkpoint_layout import TRACKER, TRAINER_STATE_FILE, iter_dir, latest_dir

CRITIC_STATE_FILE = "critic_state.pt"
logger = logging.getLogger(__name__)


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
    with_optim = not actor.args.no_save_optim
    trainer_state: dict[str, Any] = {"rollout_id": rollout_id, "scheduler": actor.scheduler.state_dict(),
                                     "rng": torch.get_rng_state()}
    if with_optim:  # a collective when sharded: every rank gathers, rank 0 writes
        trainer_state["optimizer"] = get_optimizer_state_dict(actor.model, actor.optimizer, options=opts)
    critic_state = None
    if actor.critic is not None:
        critic_state = actor.critic.state() if with_optim else {
            "model": get_model_state_dict(actor.critic.model, options=opts),
            "scheduler": actor.critic.scheduler.state_dict()}
    if actor.is_rank0():
        out.mkdir(parents=True, exist_ok=True)
        actor.model.save_pretrained(out, state_dict=model_state, safe_serialization=True)
        AutoTokenizer.from_pretrained(actor.args.hf_checkpoint).save_pretrained(out)
        torch.save(trainer_state, out / TRAINER_STATE_FILE)
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
    if "optimizer" in state:
        set_optimizer_state_dict(actor.model, actor.optimizer, state["optimizer"], options=opts)
    elif actor.is_rank0():
        logger.warning("--load %s: %s has no optimizer state (saved with --no-save-optim); "
                       "starting a fresh optimizer", load_path, ckpt)
    torch.set_rng_state(state["rng"])
    if "scheduler" in state:
        actor.scheduler.load_state_dict(state["scheduler"])
    if actor.critic is not None and (ckpt / CRITIC_STATE_FILE).exists():
        critic_state = torch.load(ckpt / CRITIC_STATE_FILE, map_location="cpu", weights_only=False)
        if "optimizer" in critic_state:
            actor.critic.load_state(critic_state)
        else:  # --no-save-optim: weights and schedule only, a fresh critic optimizer
            set_model_state_dict(actor.critic.model, critic_state["model"], options=opts)
            actor.critic.scheduler.load_state_dict(critic_state["scheduler"])
    return int(state["rollout_id"]) + 1
