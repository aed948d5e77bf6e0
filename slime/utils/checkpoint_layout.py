"""Where a run's checkpoints live on disk (Megatron-style tracker file, so `--load` finds the newest).

    <save>/iter_0000012/   config.json, model.safetensors, tokenizer files  (loads with transformers)
                           trainer_state.pt    (optimizer, rollout id, RNG; the trainer writes it)
                           rollout_state.json  (data position and Data Buffer; the rollout side writes it)
    <save>/latest_checkpointed_iteration.txt

Both sides of the run read and write here, so the layout is a ground-level fact, not the trainer's.
"""

from __future__ import annotations

import os
from pathlib import Path

from slime.errors import SlimeError

TRACKER = "latest_checkpointed_iteration.txt"
TRAINER_STATE_FILE = "trainer_state.pt"
ROLLOUT_STATE_FILE = "rollout_state.json"


def iter_dir(save: str | os.PathLike, rollout_id: int) -> Path:
    return Path(save) / f"iter_{rollout_id:07d}"


def latest_dir(load: str | os.PathLike) -> Path:
    """The checkpoint directory `--load` points at (the tracker's newest, or `load` itself)."""
    load = Path(load)
    tracker = load / TRACKER
    if tracker.exists():
        return iter_dir(load, int(tracker.read_text().strip()))
    if (load / TRAINER_STATE_FILE).exists():
        return load
    raise SlimeError(f"--load {load}: no {TRACKER} and no {TRAINER_STATE_FILE} there")


def rollout_id_of(directory: Path) -> int | None:
    """`iter_0000012` -> 12; None for a directory not named by the layout."""
    digits = directory.name.removeprefix("iter_")
    return int(digits) if digits.isdigit() else None


def has_checkpoint(load: str | os.PathLike) -> bool:
    """Whether `--load` holds a checkpoint of this layout (a tracker, or one iteration directory)."""
    load = Path(load)
    return (load / TRACKER).exists() or (load / TRAINER_STATE_FILE).exists()


def megatron_iteration_dir(path: str | os.PathLike) -> Path | None:
    """The iteration directory of a Megatron-LM `torch_dist` checkpoint (what slime's `--ref-load`
    usually is: a tracker naming `iter_XXXXXXX` or `release`, holding torch.distributed.checkpoint's
    `.metadata`), else None."""
    path = Path(path)
    tracker = path / TRACKER
    if not tracker.exists():
        return None
    step = tracker.read_text().strip()
    if step == "release":
        directory = path / "release"
    elif step.isdigit():
        directory = iter_dir(path, int(step))
    else:
        return None
    return directory if (directory / ".metadata").exists() else None
