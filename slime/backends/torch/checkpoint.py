"""The trainer's checkpoints: Hugging Face model files plus the state needed to resume
(layout in `slime.utils.checkpoint_layout`; the rollout side writes its own state file beside).
A save writes into the checkpoint's staging directory, which `checkpoint_layout.commit` renames into
place; `load` refuses a checkpoint that is not whole or not of this model. Every `.pt` file holds
tensors and plain types only and is read with `torch.load(weights_only=True)`.

`--no-save-optim` (slime's, Megatron's meaning) leaves the optimizer states out (policy and
critic); the LR schedule's position, RNG and rollout id are still saved. Loading such a
checkpoint starts a fresh optimizer and says so.

Exact resume: every rank's RNG states (torch and Python) are saved and each rank gets its own back
(same world size; otherwise rank 0's, with a warning). The checkpoint also records what it was
saved by: the model's architecture (its config) and the run's shape (critic or not, which parameters
train); `load` refuses a checkpoint whose record differs from this run's, naming each differing field.

`--save-hf PATTERN` (slime's): with every checkpoint, the policy is also written as a plain Hugging
Face model directory (config, tokenizer, safetensors; nothing to resume from) at
`PATTERN.format(rollout_id=...)`, outside the checkpoint layout, for serving or evaluation (`save_hf`).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from argparse import Namespace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from transformers import AutoTokenizer

from slime.backends.torch import lora, models
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import (
    TRAINER_STATE_FILE,
    architecture_of,
    check_complete,
    config_differences,
    halt_point,
    latest_dir,
    staging_dir,
)

CRITIC_STATE_FILE = "critic_state.pt"
ADAPTER_DIR = "adapter"  # a LoRA run's adapter, in PEFT's format, beside the merged HF files
logger = logging.getLogger(__name__)


class Checkpointable(Protocol):
    """What a checkpoint reads from and restores into (a `TrainActor`)."""

    args: Namespace
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    critic: Any
    world_size: int

    def is_rank0(self) -> bool: ...


def save(actor: Checkpointable, rollout_id: int) -> str:
    """Write the trainer's part of the checkpoint of `rollout_id` into its staging directory (returned);
    the rollout side adds its state there, and `checkpoint_layout.commit` puts it in place."""
    out = staging_dir(actor.args.save, rollout_id)
    raw_state = models.full_state(actor.model, actor.world_size, merge=False)  # a collective when sharded
    is_lora = lora.is_lora(actor.model)
    model_state = lora.merged(raw_state, lora.scaling(actor.model)) if is_lora else raw_state
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    with_optim = not actor.args.no_save_optim
    trainer_state: dict[str, Any] = {
        "rollout_id": rollout_id,
        "scheduler": actor.scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        "rng_per_rank": rng_of_every_rank(actor),
        "run_config": run_config(actor),
    }
    if with_optim:  # a collective when sharded: every rank gathers, rank 0 writes
        trainer_state["optimizer"] = get_optimizer_state_dict(actor.model, actor.optimizer, options=opts)
    critic_state = None
    if actor.critic is not None:
        critic_state = (
            actor.critic.state()
            if with_optim
            else {
                "model": get_model_state_dict(actor.critic.model, options=opts),
                "scheduler": actor.critic.scheduler.state_dict(),
            }
        )
    if actor.is_rank0():
        shutil.rmtree(out, ignore_errors=True)  # what a killed run left of this save
        out.mkdir(parents=True)
        write_hf_model(actor, out, model_state)
        if is_lora:  # what resuming needs (the HF files hold the merged model, for serving)
            lora.save_adapter(actor.model, out / ADAPTER_DIR, raw_state, actor.args.ref_load)
        halt_point("trainer_weights", rollout_id)
        torch.save(trainer_state, out / TRAINER_STATE_FILE)  # tensors and plain types only: weights_only loads
        if critic_state is not None:  # value head + backbone + its optimizer, to resume PPO
            torch.save(critic_state, out / CRITIC_STATE_FILE)
        if actor.args.save_hf is not None:
            save_hf(actor, rollout_id, model_state)
    if actor.world_size > 1:
        dist.barrier()
    return str(out)


def write_hf_model(actor: Checkpointable, out: Path, model_state: dict[str, torch.Tensor]) -> None:
    actor.model.save_pretrained(out, state_dict=model_state, safe_serialization=True)
    AutoTokenizer.from_pretrained(actor.args.hf_checkpoint).save_pretrained(out)


def save_hf(actor: Checkpointable, rollout_id: int, model_state: dict[str, torch.Tensor]) -> Path:
    """`--save-hf`: the policy's full weights as a Hugging Face model directory at the pattern
    formatted with `rollout_id` (rank 0; weights an earlier save left there are replaced)."""
    out = Path(actor.args.save_hf.format(rollout_id=rollout_id))
    if out.resolve() == Path(actor.args.hf_checkpoint).resolve():  # slime's refusal too
        raise SlimeError(f"--save-hf {actor.args.save_hf}: {out} is --hf-checkpoint; give another directory")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.safetensors"), *out.glob("*.safetensors.index.json")]:
        stale.unlink()  # a save with fewer shards must not leave the old ones to be loaded beside
    write_hf_model(actor, out, model_state)
    logger.info("--save-hf: rollout %d's policy written to %s", rollout_id, out)
    return out


def load(actor: Checkpointable, load_path: str) -> int:
    """Restore weights and optimizer from `--load`; return the next rollout id. A checkpoint that is
    not whole, or not of this model, stops the run, naming what is wrong."""
    what = f"--load {load_path}"
    ckpt = latest_dir(load_path)
    check_complete(ckpt, what, needs=("config.json", "*.safetensors", TRAINER_STATE_FILE))
    is_lora = lora.is_lora(actor.model)
    if is_lora and not (ckpt / ADAPTER_DIR / lora.ADAPTER_WEIGHTS).is_file():
        raise SlimeError(
            f"{what}: {ckpt} has no LoRA adapter ({ADAPTER_DIR}/{lora.ADAPTER_WEIGHTS}): it was saved by a run "
            f"without LoRA. Resume it without --enable-lora / --lora-rank, or start LoRA from its weights with "
            f"--hf-checkpoint {ckpt} (without --load)"
        )
    check_same_architecture(actor.model, ckpt, what)
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        try:
            weights.update(load_file(str(f)))
        except Exception as e:
            raise SlimeError(f"{what}: cannot read {f} ({type(e).__name__}: {e})") from e
    check_same_model(actor.model, weights, f"{what}: {ckpt}")
    state = load_state_file(ckpt / TRAINER_STATE_FILE, what)
    if state.get("train_backend", "fsdp") != "fsdp":  # the megatron backend's optimizer state is its torch_dist
        raise SlimeError(
            f"{what}: {ckpt} was saved by --train-backend {state['train_backend']}, whose optimizer state the fsdp "
            f"backend cannot read; resume it with --train-backend {state['train_backend']}, or start from its "
            f"weights with --hf-checkpoint {ckpt} (without --load)"
        )
    missing = [k for k in ("rollout_id", "rng") if k not in state]
    if missing:
        raise SlimeError(
            f"{what}: {ckpt / TRAINER_STATE_FILE} is not a slime-rl trainer state (it has no {', '.join(missing)})"
        )
    check_run_config(actor, state, "optimizer" in state, ckpt, what)
    opts = StateDictOptions(full_state_dict=True, strict=False)
    if is_lora:  # the base is --ref-load's (it never trains); the adapter is the checkpoint's
        lora.load_adapter(actor.model, ckpt / ADAPTER_DIR, what)
        check_lora_resume(actor, weights, f"{what}: {ckpt}")
    else:
        set_model_state_dict(actor.model, weights, options=opts)
    if "optimizer" in state:
        set_optimizer_state_dict(actor.model, actor.optimizer, state["optimizer"], options=opts)
    elif actor.is_rank0():
        logger.warning(
            "--load %s: %s has no optimizer state (saved with --no-save-optim); starting a fresh optimizer",
            load_path,
            ckpt,
        )
    restore_rng(actor, state, what)
    if "scheduler" in state:
        actor.scheduler.load_state_dict(state["scheduler"])
    if actor.critic is not None and (ckpt / CRITIC_STATE_FILE).exists():
        critic_state = load_state_file(ckpt / CRITIC_STATE_FILE, what)
        if "optimizer" in critic_state:
            actor.critic.load_state(critic_state)
        else:  # --no-save-optim: weights and schedule only, a fresh critic optimizer
            set_model_state_dict(actor.critic.model, critic_state["model"], options=opts)
            actor.critic.scheduler.load_state_dict(critic_state["scheduler"])
    return int(state["rollout_id"]) + 1


def load_state_file(path: Path, what: str) -> dict[str, Any]:
    """A `.pt` file this project wrote (tensors and plain types), read with `weights_only=True`."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise SlimeError(
            f"{what}: cannot read {path} as a slime-rl state file ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    if not isinstance(state, dict):
        raise SlimeError(f"{what}: {path} holds a {type(state).__name__}, not a slime-rl state dict")
    return state


def check_run_config(actor: Checkpointable, state: dict[str, Any], with_optimizer: bool, ckpt: Path, what: str) -> None:
    """The checkpoint's recorded run shape is this run's (`run_config`), else stop naming each difference."""
    if "run_config" not in state:  # (checkpoints written before it was recorded are not checked)
        return
    saved = dict(state["run_config"])
    if not with_optimizer:  # no optimizer state to fit: which parameters train may change
        saved.pop(TRAINABLE, None)
    current = {k: v for k, v in run_config(actor).items() if k in saved}
    differences = config_differences(saved, current)
    if differences:
        raise SlimeError(
            f"{what}: {ckpt} was saved by a run of another configuration, so this run cannot resume from it: "
            f"{'; '.join(differences)}. Resume with the options it was saved with, or start a new run from its "
            f"weights with --hf-checkpoint {ckpt} (without --load)"
        )


TRAINABLE = "trainable_parameters (--only-train-params-name-list / --freeze-params-name-list)"


def run_config(actor: Checkpointable) -> dict[str, Any]:
    """What a resumed run must share with the run that saved: the critic (its state is part of the
    checkpoint, or is not) and the parameters the optimizer state belongs to."""
    return {
        "critic (--advantage-estimator ppo)": actor.critic is not None,
        TRAINABLE: [n for n, p in actor.model.named_parameters() if p.requires_grad],
    }


def _plain_config(config: Any) -> dict[str, Any]:
    """A config's fields as `config.json` spells them (JSON types: tuples become lists)."""
    return json.loads(config.to_json_string(use_diff=False))


def check_same_architecture(model: torch.nn.Module, ckpt: Path, what: str) -> None:
    """The checkpoint's `config.json` describes this model (Megatron's check_checkpoint_args): every
    architecture field it sets that differs is named, with both values (a field it leaves out is
    not compared: the tensors' names and shapes are, after this)."""
    path = ckpt / "config.json"
    try:
        saved = architecture_of(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise SlimeError(f"{what}: cannot read {path} as a model config ({type(e).__name__}: {e})") from e
    current = architecture_of(_plain_config(model.config))
    differences = config_differences(saved, {k: current.get(k) for k in saved})
    if differences:
        raise SlimeError(
            f"{what}: {ckpt} holds another model than --hf-checkpoint's ({'; '.join(differences)}); "
            f"point --load at a checkpoint of this model, or --hf-checkpoint at the checkpoint's model"
        )


def rng_of_every_rank(actor: Checkpointable) -> list[dict[str, Any]]:
    """Each rank's torch and Python RNG states, rank order (a collective when sharded)."""
    version, internal, gauss = random.getstate()
    mine = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if actor.world_size == 1:
        return [mine]
    every: list[Any] = [None] * actor.world_size
    dist.all_gather_object(every, mine)
    return every


def restore_rng(actor: Checkpointable, state: dict[str, Any], what: str) -> None:
    per_rank = state.get("rng_per_rank")
    rank = dist.get_rank() if actor.world_size > 1 else 0
    if per_rank is None or len(per_rank) != actor.world_size:
        if per_rank is not None and actor.is_rank0():
            logger.warning(
                "%s: saved by %d trainer rank(s), resumed by %d: every rank restarts from rank 0's RNG "
                "state (a resume that matches the uninterrupted run needs the same count)",
                what,
                len(per_rank),
                actor.world_size,
            )
        torch.set_rng_state(state["rng"])
        return
    mine = per_rank[rank]
    torch.set_rng_state(mine["torch"])
    version, internal, gauss = mine["python"]
    random.setstate((version, tuple(internal), gauss))


def check_lora_resume(actor: Checkpointable, weights: dict[str, torch.Tensor], where: str) -> None:
    """A LoRA checkpoint's HF files are its base merged with its adapter: this run's base merged with the
    loaded adapter must give them back, bit for bit (else --ref-load is another base than the saved run's)."""
    mine = models.full_state(actor.model, actor.world_size)
    differ = sorted(k for k, v in weights.items() if k in mine and not torch.equal(mine[k].to(v.dtype), v))
    if differ:
        raise SlimeError(
            f"{where}: this run's base model (--ref-load {actor.args.ref_load}) with the checkpoint's adapter does not "
            f"give the checkpoint's weights ({len(differ)} tensors differ, e.g. {differ[0]}): the checkpoint was "
            f"trained on another base model, or with another of --bf16 / --fp16 / neither (which keep the base "
            f"weights in bf16 / fp16 / fp32); give the --ref-load / --hf-checkpoint and precision it was saved with"
        )


def check_same_model(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """The checkpoint's tensors are this model's: same names, same shapes (tied copies may be absent;
    a LoRA policy's are the plain model's)."""
    expected = model.state_dict()
    if lora.is_lora(model):
        expected = lora.base_view(expected)
    shapes = {k: tuple(v.shape) for k, v in expected.items()}
    unexpected = sorted(k for k in weights if k not in shapes)
    wrong = [
        f"{k} {tuple(weights[k].shape)} (the model's {shapes[k]})"
        for k in sorted(weights)
        if k in shapes and tuple(weights[k].shape) != shapes[k]
    ]
    by_storage: dict[int, list[str]] = {}
    for k, v in expected.items():
        local = v.to_local() if hasattr(v, "to_local") else v
        if local.numel():
            by_storage.setdefault(local.data_ptr(), []).append(k)
    tied = {k: names for names in by_storage.values() if len(names) > 1 for k in names}
    missing = sorted(k for k in shapes if k not in weights and not any(a in weights for a in tied.get(k, [])))
    problems = []
    if missing:
        problems.append(f"{len(missing)} of the model's tensors are missing (e.g. {', '.join(missing[:3])})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensors are not the model's (e.g. {', '.join(unexpected[:3])})")
    if wrong:
        problems.append(f"shapes differ: {', '.join(wrong[:3])}")
    if problems:
        raise SlimeError(f"{where} does not hold the weights of --hf-checkpoint's model: {'; '.join(problems)}")
