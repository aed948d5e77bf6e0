"""One run per run directory: a second run is refused before anything starts unless it resumes the
first (`--load` with a checkpoint) or asks to start over (`--overwrite-run-dir`, which moves the
earlier run aside); a resumed stage's metrics hold each rollout once, its global steps continuing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from slime.errors import SlimeError
from slime.observability.metrics import SUPERSEDED_FILE, MetricsLogger, read_metrics
from slime.observability.run_dir import args_path, check_run_dir
from slime.utils.checkpoint_layout import TRACKER
from tests.helpers import make_args


def _args(run_dir: Path, *argv: str):
    return make_args("--run-dir", str(run_dir), *argv)


def test_a_fresh_or_missing_directory_is_fine_and_created(tmp_path):
    assert check_run_dir(_args(tmp_path / "new" / "run")) is None
    assert (tmp_path / "new" / "run").is_dir()


def test_a_directory_holding_a_run_is_refused_naming_the_ways_out(tmp_path):
    run = tmp_path / "run"
    args = _args(run)
    check_run_dir(args)
    args_path(args).write_text("{}")
    with pytest.raises(SlimeError, match=r"--run-dir .*run already holds a run, started .*--load.*--overwrite-run-dir"):
        check_run_dir(_args(run))
    # another stage of the same run (the default job's SFT then RL) is not another run
    assert check_run_dir(_args(run, "--stage", "rl")) is None


def test_resuming_with_a_checkpoint_is_allowed(tmp_path):
    run, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    args_path(_args(run)).write_text("{}")
    with pytest.raises(SlimeError, match="already holds a run"):  # --load without a checkpoint in it
        check_run_dir(_args(run, "--load", str(ckpt)))
    (ckpt / TRACKER).write_text("1")
    assert check_run_dir(_args(run, "--load", str(ckpt))) is None


def test_overwrite_moves_the_earlier_run_aside(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text('{"earlier": true}')
    (run / "metrics.jsonl").write_text('{"rollout_id": 0, "global_step": 0}\n')
    note = check_run_dir(_args(run, "--overwrite-run-dir"))
    (aside,) = tmp_path.glob("run.replaced-*")
    assert note == f"--overwrite-run-dir: the earlier run in {run} was moved to {aside}"
    assert json.loads((aside / "args.json").read_text()) == {"earlier": True}  # nothing deleted
    assert run.is_dir() and not any(run.iterdir())
    # its own checkpoint cannot be loaded and moved away at once
    (run / "args.json").write_text("{}")
    (run / "ckpt").mkdir()
    (run / "ckpt" / TRACKER).write_text("1")
    with pytest.raises(SlimeError, match="would move --load"):
        check_run_dir(_args(run, "--overwrite-run-dir", "--load", str(run / "ckpt")))


def test_a_file_or_an_unwritable_directory_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SlimeError, match=r"^--run-dir .*/f is a file, not a directory$"):
        check_run_dir(_args(tmp_path / "f"))
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permission bits: a read-only mount it is
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        ro.chmod(0o555)
    try:
        with pytest.raises(
            SlimeError, match=r"--run-dir .*ro cannot be written: (read-only file system|permission denied)"
        ):
            check_run_dir(_args(ro))
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)])


def test_a_resumed_stage_supersedes_the_rows_past_its_checkpoint(tmp_path):
    """Rollouts 0-4 logged, the checkpoint was at 2: the resumed logger starts at 3. Rows 3 and 4 of the
    interrupted run move to the superseded file; the file then holds each rollout once, global steps
    continuing. Another stage's rows are never touched."""
    for stage, offset in ((None, 0), ("rl", 5)):
        run = tmp_path / f"run-{stage}"
        if stage:
            with MetricsLogger(run, stage="sft", console=False) as sft:
                for step in range(5):
                    sft.log(step, {"x": -1})
        with MetricsLogger(run, stage=stage, console=False) as first:
            for step in range(5):
                first.log(step, {"x": step})
        with MetricsLogger(run, stage=stage, console=False) as resumed:
            for step in (3, 4, 5):
                resumed.log(step, {"x": 10 + step})
        rows = [r for r in read_metrics(run) if r.get("stage") == stage]
        assert [(r["rollout_id"], r["global_step"], r["x"]) for r in rows] == [
            (0, offset, 0),
            (1, offset + 1, 1),
            (2, offset + 2, 2),
            (3, offset + 3, 13),
            (4, offset + 4, 14),
            (5, offset + 5, 15),
        ]
        old = [json.loads(line) for line in (run / SUPERSEDED_FILE).read_text().splitlines()]
        assert [(r["rollout_id"], r["x"]) for r in old] == [(3, 3), (4, 4)]
        if stage:
            assert [r["x"] for r in read_metrics(run) if r.get("stage") == "sft"] == [-1] * 5


def test_save_must_be_writable_and_have_room_for_a_checkpoint(tmp_path, monkeypatch):
    from slime.observability import run_dir as rd

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    args = _args(tmp_path / "run", "--hf-checkpoint", str(model), "--save", str(tmp_path / "ckpt"))
    rd.check_disk_room(args)
    assert (tmp_path / "ckpt").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(SlimeError, match=r"^--save .*file/ckpt cannot be written"):
        rd.check_disk_room(
            _args(tmp_path / "run", "--hf-checkpoint", str(model), "--save", str(tmp_path / "file" / "ckpt"))
        )
    usage = rd.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(rd.shutil, "disk_usage", lambda p: usage._replace(free=4000))
    with pytest.raises(SlimeError, match=r"--save .*: 0.00 GiB free, and one checkpoint of this model .* takes about"):
        rd.check_disk_room(args)
    offloaded = _args(tmp_path / "run", "--hf-checkpoint", str(model), "--offload-train")
    full_run_dir = usage._replace(free=1000)
    monkeypatch.setattr(rd.shutil, "disk_usage", lambda p: full_run_dir if str(p) == str(tmp_path / "run") else usage)
    with pytest.raises(SlimeError, match=r"--run-dir .*: 0.00 GiB free, and --offload-train's copy of the optimizer"):
        rd.check_disk_room(offloaded)
