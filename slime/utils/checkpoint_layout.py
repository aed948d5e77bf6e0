"""Where a run's checkpoints live on disk (Megatron-style tracker file, so `--load` finds the newest).

    <save>/iter_0000012/   config.json, model.safetensors, tokenizer files  (loads with transformers)
                           trainer_state.pt    (optimizer, rollout id, RNG; the trainer writes it)
                           rollout_state.json  (data position and Data Buffer; the rollout side writes it)
                           checkpoint_manifest.json (every file and its size, written at commit)
    <save>/latest_checkpointed_iteration.txt   (replaced last: it only ever names a complete checkpoint)

Both sides of the run read and write here, so the layout is a ground-level fact, not the trainer's.
"""

from __future__ import annotations

import json
import os
import shutil
import time
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
        step = tracker.read_text().strip()
        if not step.isdigit():
            raise SlimeError(
                f"--load {load}: {TRACKER} holds {step[:40]!r}, not a rollout id: not a checkpoint "
                f"directory of a slime-rl run"
            )
        return iter_dir(load, int(step))
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


# --------------------------------------------------------------------------- atomic checkpoints
# A checkpoint is written whole into `<save>/.iter_XXXXXXX.partial/` (trainer and rollout side
# both), then `commit` flushes it, lists its files in `checkpoint_manifest.json`, renames the
# directory into place and only then replaces the tracker: a run killed at any moment leaves the
# tracker naming a complete checkpoint (or none), never a half-written one.
MANIFEST = "checkpoint_manifest.json"
MANIFEST_FORMAT = "slime-rl checkpoint 1"
# what each file of a checkpoint is, for the messages of `check_complete`
PARTS = {
    "config.json": "the model config",
    "*.safetensors": "the model weights",
    TRAINER_STATE_FILE: "the trainer state (rollout id, optimizer, LR schedule, RNG)",
    ROLLOUT_STATE_FILE: "the data position and Data Buffer",
    "critic_state.pt": "the critic",
}
# Test hook: with SLIME_TEST_HALT_AT=<point>@<rollout id>, the process reaching that point writes
# the point to the file SLIME_TEST_HALT_FILE names and waits there, for a test to kill the whole
# run at a precise moment (e.g. inside a save).
HALT_AT_ENV, HALT_FILE_ENV = "SLIME_TEST_HALT_AT", "SLIME_TEST_HALT_FILE"


def halt_point(point: str, rollout_id: int) -> None:
    if os.environ.get(HALT_AT_ENV) != f"{point}@{rollout_id}":
        return
    Path(os.environ[HALT_FILE_ENV]).write_text(point)
    while True:  # until the test kills the run
        time.sleep(1)


def staging_dir(save: str | os.PathLike, rollout_id: int) -> Path:
    """Where the checkpoint of `rollout_id` is written before `commit` renames it into place."""
    return Path(save) / f".iter_{rollout_id:07d}.partial"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by a file holding `text`: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def commit(save: str | os.PathLike, rollout_id: int) -> Path:
    """Make the staged checkpoint of `rollout_id` the run's latest: flush every file, write the
    manifest, rename the directory into place, then replace the tracker."""
    save = Path(save)
    staging, final = staging_dir(save, rollout_id), iter_dir(save, rollout_id)
    if not staging.is_dir():
        raise SlimeError(f"checkpoint of rollout {rollout_id}: nothing was staged in {staging}")
    if final.is_dir():
        # files only there were written by a custom --data-source-path's save(rollout_id) (slime's
        # contract names the checkpoint by its rollout id): they join the checkpoint
        for p in final.iterdir():
            if p.name != MANIFEST and not (staging / p.name).exists():
                p.rename(staging / p.name)
    files = {
        str(p.relative_to(staging)): p.stat().st_size
        for p in sorted(staging.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"format": MANIFEST_FORMAT, "rollout_id": rollout_id, "files": files}
    for name in files:
        _fsync(staging / name)
    write_atomic(staging / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    halt_point("staged", rollout_id)
    old = save / f".iter_{rollout_id:07d}.replaced"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    staging.rename(final)
    _fsync(save)
    halt_point("renamed", rollout_id)
    write_atomic(save / TRACKER, f"{rollout_id}\n")
    for leftover in [old, *save.glob(".iter_*.partial")]:  # older saves a killed run never finished
        shutil.rmtree(leftover, ignore_errors=True)
    return final


def check_complete(directory: Path, what: str, needs: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint directory that is not whole, naming what is wrong: no manifest (a save
    that never finished, or not a slime-rl checkpoint), a file the manifest lists missing or of
    another size (truncated), or a part this run needs (`needs`: names of `PARTS`) missing."""
    if not directory.is_dir():
        raise SlimeError(f"{what}: the checkpoint directory {directory} does not exist")
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        raise SlimeError(
            f"{what}: {directory} has no {MANIFEST}, so it is not a complete checkpoint: a save that "
            f"did not finish, or a directory not written by slime-rl; point --load at a complete one"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise SlimeError(f"{what}: cannot read {manifest_path}: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise SlimeError(
            f"{what}: {manifest_path} is not a slime-rl checkpoint manifest "
            f"(format {manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    for name, size in manifest.get("files", {}).items():
        p = directory / name
        if not p.exists():
            raise SlimeError(f"{what}: {directory} is incomplete: {name} ({_part(name)}) is missing")
        if p.stat().st_size != size:
            raise SlimeError(
                f"{what}: {directory} is damaged: {name} ({_part(name)}) has {p.stat().st_size} bytes, "
                f"the save wrote {size}"
            )
    for part in needs:
        if not list(directory.glob(part)):
            raise SlimeError(
                f"{what}: {directory} has no {part} ({PARTS.get(part, part)}), which this run needs to resume"
            )


# --------------------------------------------------------------------------- same model, same run
# The fields of a Hugging Face config that decide what function the weights compute (Megatron's
# check_checkpoint_args compares the same things: layers, widths, heads, vocabulary, positions).
# Two of them differing with every tensor shape equal (heads, rope base, norm epsilon) would load
# silently into another model.
ARCHITECTURE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "layer_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
)


def architecture_of(config: dict) -> dict:
    """The `ARCHITECTURE_FIELDS` a config (as `config.json` holds it) sets."""
    return {k: config[k] for k in ARCHITECTURE_FIELDS if k in config}


def config_differences(saved: dict, current: dict) -> list[str]:
    """`field: checkpoint X, this run Y` for each field of either dict whose values differ (a field
    only one side has counts as differing)."""
    missing = object()
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, missing), current.get(key, missing)
        if isinstance(a, list) and isinstance(b, list) and a != b and all(isinstance(x, str) for x in a + b):
            only_saved, only_here = [x for x in a if x not in b], [x for x in b if x not in a]
            out.append(
                f"{key}: {len(a)} in the checkpoint, {len(b)} in this run"
                + (f"; only in the checkpoint: {', '.join(only_saved[:3])}" if only_saved else "")
                + (f"; only in this run: {', '.join(only_here[:3])}" if only_here else "")
            )
        elif a != b:
            out.append(
                f"{key}: checkpoint {'(none)' if a is missing else repr(a)}, "
                f"this run {'(none)' if b is missing else repr(b)}"
            )
    return out


def _part(name: str) -> str:
    if name.endswith(".safetensors"):
        return PARTS["*.safetensors"]
    return PARTS.get(name, "a file of the checkpoint")


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


# --------------------------------------------------------------------------- weight snapshot
# With --use-fault-tolerance the trainer's rank 0 writes the weights it just pushed to the engines
# here (one safetensors file, replaced atomically, its weight version in the file's metadata); an
# engine the rollout side restarts loads it with /update_weights_from_disk, so it serves the current
# policy without a call into the trainer.
SNAPSHOT_FILE = "model.safetensors"


def weight_snapshot_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "fault_tolerance" / "weights"


def write_weight_snapshot(run_dir: str | os.PathLike, tensors: dict, weight_version: str) -> Path:
    """Write `tensors` ({name: CPU tensor}) with `weight_version`, atomically (readers see the old
    file or the new one, never half of one)."""
    from safetensors.torch import save_file

    root = weight_snapshot_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{SNAPSHOT_FILE}.{os.getpid()}.tmp"
    save_file(
        {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
        str(tmp),
        metadata={"weight_version": str(weight_version)},
    )
    os.replace(tmp, root / SNAPSHOT_FILE)
    return root / SNAPSHOT_FILE


def weight_snapshot_version(run_dir: str | os.PathLike) -> str | None:
    """The weight version of the snapshot, or None when there is none yet."""
    from safetensors import safe_open

    path = weight_snapshot_dir(run_dir) / SNAPSHOT_FILE
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get("weight_version")


def latest_checkpoint_note(save: str | os.PathLike | None) -> str:
    """Where to resume from: the newest complete checkpoint under `save`, or that there is none."""
    if save and (Path(save) / TRACKER).exists():
        try:
            return f"resume from the last complete checkpoint with --load {save} ({latest_dir(save)})"
        except (SlimeError, ValueError, OSError):
            pass
    return f"no complete checkpoint under --save {save} to resume from"
