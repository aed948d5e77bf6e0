"""Checkpoints of the megatron backend: Megatron's own `torch_dist` format for what resumes, beside
the files every slime-rl checkpoint has (layout in `slime.utils.checkpoint_layout`).

    iter_0000012/  .metadata, __*_*.distcp, common.pt, metadata.json   Megatron's torch_dist
                       (dist_checkpointing: the model's and the optimizer's sharded state dicts,
                        the critic's under "critic." beside them, each rank writing its shards;
                        read back at another tensor-parallel size)
                   config.json, model.safetensors, tokenizer files     the policy for transformers
                   trainer_state.pt   rollout id, the LR schedules' state, RNG of every rank
                   rollout_state.json ...                              (the rollout side's)

Resuming reads the torch_dist part (the optimizer's moments included, unless the run saved with
`--no-save-optim`); the Hugging Face files serve the engines, evaluation and `--hf-checkpoint`. A
checkpoint of the other backend is refused with what to do instead, as is one that is not whole.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

import torch
import torch.distributed as dist

from slime.backends.megatron_utils import cpu_support
from slime.backends.torch import checkpoint as torch_checkpoint
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import (
    TRAINER_STATE_FILE,
    check_complete,
    halt_point,
    latest_dir,
    staging_dir,
)

BACKEND = "megatron"
TORCH_DIST_INDEX = ".metadata"  # torch.distributed.checkpoint's index: its presence makes a torch_dist checkpoint
logger = logging.getLogger(__name__)


CRITIC = "critic."  # the critic's tensors' names in the torch_dist part: its own, beside the policy's


def _trained(actor: Any) -> list[tuple[str, Any]]:
    """What trains on this rank, each with the prefix of its names in the checkpoint."""
    return [("", actor)] + ([(CRITIC, actor.critic)] if actor.critic is not None else [])


def _sharded_state(actor: Any, with_optimizer: bool, loading: bool) -> dict[str, Any]:
    state = {}
    for prefix, owner in _trained(actor):
        model_state = owner.policy.model.sharded_state_dict(prefix=prefix)
        state[prefix + "model"] = model_state
        if with_optimizer:
            state[prefix + "optimizer"] = owner.optimizer.sharded_state_dict(model_state, is_loading=loading)
    return state


def save(actor: Any, rollout_id: int) -> str:
    """Write the trainer's part of the checkpoint of `rollout_id` into its staging directory (every
    rank calls: the gathers and the torch_dist write are collectives)."""
    from megatron.core import dist_checkpointing

    a = actor.args
    out = staging_dir(a.save, rollout_id)
    hf_state = actor.full_state_dict()
    if actor.is_rank0():
        shutil.rmtree(out, ignore_errors=True)  # what a killed run left of this save
        out.mkdir(parents=True)
    dist.barrier()
    with cpu_support.cuda_calls_on_cpu():
        dist_checkpointing.save(_sharded_state(actor, not a.no_save_optim, loading=False), str(out))
    trainer_state = {
        "rollout_id": rollout_id,
        "train_backend": BACKEND,
        "scheduler": actor.scheduler.state_dict(),  # Megatron's: the LR schedule's position
        "critic_scheduler": actor.critic.scheduler.state_dict() if actor.critic is not None else None,
        "with_optimizer": not a.no_save_optim,
        "rng": torch.get_rng_state(),
        "rng_per_rank": torch_checkpoint.rng_of_every_rank(actor),
        "run_config": torch_checkpoint.run_config(actor),
    }
    if actor.is_rank0():
        torch_checkpoint.write_hf_model(actor, out, hf_state)
        halt_point("trainer_weights", rollout_id)
        torch.save(trainer_state, out / TRAINER_STATE_FILE)
        if a.save_hf is not None:
            torch_checkpoint.save_hf(actor, rollout_id, hf_state)
    dist.barrier()
    return str(out)


def load(actor: Any, load_path: str) -> int:
    """Resume from `--load`: weights and optimizer state from the torch_dist part (at this run's
    tensor-parallel size, whatever it was saved with), the step count and RNG from the trainer
    state; returns the next rollout id."""
    from megatron.core import dist_checkpointing

    what = f"--load {load_path}"
    ckpt = latest_dir(load_path)
    check_complete(ckpt, what, needs=(TRAINER_STATE_FILE,))
    state = torch_checkpoint.load_state_file(ckpt / TRAINER_STATE_FILE, what)
    if state.get("train_backend", "fsdp") != BACKEND or not (ckpt / TORCH_DIST_INDEX).exists():
        raise SlimeError(
            f"{what}: {ckpt} was saved by --train-backend {state.get('train_backend', 'fsdp')}, whose optimizer "
            f"state the megatron backend cannot read; resume it with that backend, or start from its weights "
            f"with --hf-checkpoint {ckpt} (without --load)"
        )
    torch_checkpoint.check_same_architecture(actor.model, ckpt, what)
    with_optimizer = bool(state["with_optimizer"])
    torch_checkpoint.check_run_config(actor, state, with_optimizer, ckpt, what)
    with cpu_support.cuda_calls_on_cpu():
        loaded = dist_checkpointing.load(_sharded_state(actor, with_optimizer, loading=True), str(ckpt))
        for prefix, owner in _trained(actor):
            owner.policy.model.load_state_dict({k.removeprefix(prefix): v for k, v in loaded[prefix + "model"].items()})
            if with_optimizer:
                owner.optimizer.load_state_dict(loaded[prefix + "optimizer"])
    if not with_optimizer and actor.is_rank0():
        logger.warning("%s: %s has no optimizer state (saved with --no-save-optim); a fresh optimizer", what, ckpt)
    actor.scheduler.load_state_dict(state["scheduler"])
    if actor.critic is not None:  # (the run configuration, checked above, has a critic in both)
        actor.critic.scheduler.load_state_dict(state["critic_scheduler"])
    torch_checkpoint.restore_rng(actor, state, what)
    return int(state["rollout_id"]) + 1
