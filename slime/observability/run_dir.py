"""One run per run directory: a second run never mixes its metrics, arguments and samples into an
earlier one's.

A run directory holds one run per stage (the default job puts its SFT and RL stages side by side):
the stage's arguments file (`args.json`, or `args.<stage>.json`) marks it. Starting a stage whose
marker exists is refused before anything starts, unless

* `--load` has a checkpoint: the run resumes, and its metrics continue cleanly (the rows the
  interrupted run wrote past that checkpoint move to `metrics.superseded.jsonl`, see
  `slime.observability.metrics`), or
* `--overwrite-run-dir`: the earlier directory is moved aside to `<run-dir>.replaced-<time>`
  (nothing is deleted) and the run starts in a fresh one.

The directory must also be a directory and writable, and so must `--save`, with room for a
checkpoint; each problem is one line (`SlimeError`), before anything starts.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from slime.errors import SlimeError
from slime.utils.checkpoint_layout import has_checkpoint


def args_path(args: Namespace) -> Path:
    """The stage's arguments file, which also marks the run directory as holding that stage."""
    return Path(args.run_dir) / (f"args.{args.stage}.json" if args.stage else "args.json")


def _inside(path: str | os.PathLike, directory: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def check_run_dir(args: Namespace) -> str | None:
    """Refuse a run directory that is a file, cannot be written, or holds another run of this stage
    (see the module docstring); returns a note for the console when it moved an earlier run aside."""
    run_dir = Path(args.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise SlimeError(f"--run-dir {run_dir} is a file, not a directory")
    note = None
    marker = args_path(args)
    if marker.exists():
        resuming = bool(args.load) and has_checkpoint(args.load)
        if args.overwrite_run_dir:
            if args.load and _inside(args.load, run_dir):
                raise SlimeError(
                    f"--overwrite-run-dir would move --load {args.load} aside with the earlier run in "
                    f"--run-dir {run_dir}: resume it (drop --overwrite-run-dir) or load from elsewhere"
                )
            aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(aside)
            note = f"--overwrite-run-dir: the earlier run in {run_dir} was moved to {aside}"
        elif not resuming:
            stage = f" (stage {args.stage!r})" if args.stage else ""
            raise SlimeError(
                f"--run-dir {run_dir} already holds a run{stage}, started "
                f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(marker.stat().st_mtime))}: resume it with "
                f"--load <its checkpoint directory>, start over with --overwrite-run-dir (the earlier run is "
                f"moved aside, not deleted), or pass another --run-dir"
            )
    check_writable(run_dir, "--run-dir")
    return note


def check_writable(directory: str | os.PathLike, option: str) -> None:
    """`directory` (made if missing) takes a new file; else one line naming `option` and why."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".slime-write-check-"):
            pass
    except OSError as e:
        reason = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}.get(e.errno, e.strerror)
        raise SlimeError(f"{option} {directory} cannot be written: {reason}") from None


def model_bytes(model_dir: str | os.PathLike) -> int:
    """The size of a Hugging Face model directory's weight files."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*") if p.suffix in (".safetensors", ".bin", ".pt"))


def check_disk_room(args: Namespace) -> None:
    """`--save` takes files and has room for one checkpoint: the weights plus the optimizer's two
    float32 moments, about 5x the model's files when they are bfloat16 (3x for float32). With
    --offload-train the run directory holds the optimizer state while the engines run (~4x)."""
    size = model_bytes(args.hf_checkpoint)
    if args.save:
        check_writable(args.save, "--save")
        _check_room(args.save, 5 * size, "--save", "one checkpoint of this model (weights and optimizer state)")
    if args.offload_train:
        _check_room(args.run_dir, 4 * size, "--run-dir", "--offload-train's copy of the optimizer state")


def _check_room(path: str | os.PathLike, need: int, option: str, what: str) -> None:
    free = shutil.disk_usage(path).free
    if free < need:
        raise SlimeError(f"{option} {path}: {free / 2**30:.2f} GiB free, and {what} takes about {need / 2**30:.2f} GiB")
