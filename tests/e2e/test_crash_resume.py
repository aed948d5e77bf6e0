"""Runs that survive: the whole run (driver, Ray, trainer, engine) is SIGKILLed at random moments and
at precise points inside the save (SLIME_TEST_HALT_AT stops the process reaching that point until
the test kills everything), and resumed each time with `--load X --save X`. The run continues from
a complete checkpoint every time and ends where an uninterrupted run ends: the same metrics for
every rollout and the same final weights. Along the way a reward that raises for 1 sample in 10
leaves those samples FAILED, counted, and out of the statistics.

Two kills by default: inside the trainer's save and inside the rollout manager's. The soak test
(`--soak`) kills the run ten times, at random moments and at every save point the run has; the
driver's own commit points are also killed in a real process by
tests/utils/test_atomic_checkpoints.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from slime.utils.checkpoint_layout import HALT_AT_ENV, HALT_FILE_ENV, MANIFEST, TRACKER, iter_dir
from tests.helpers import alive, descendants

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NUM_ROLLOUT = 5
# (point, rollout) where the run is killed (the rollout is moved up to where a resumed run starts, if
# it is past it): inside the save after the trainer wrote the weights and before its state, after the
# data state, once everything is flushed and listed but before the rename, and after the rename but
# before the tracker; "random": at a random moment between the start and about two rollouts in
KILLS = [("trainer_weights", 0), ("rollout_state", 1)]
SOAK_KILLS = [
    ("trainer_weights", 0),
    ("staged", 0),
    ("renamed", 0),
    ("random", None),
    ("rollout_state", 1),
    ("random", None),
    ("trainer_weights", 2),
    ("staged", 2),
    ("renamed", 3),
    ("random", None),
]
COMPARED = (
    "rollout/raw_reward",
    "rollout/status/failed",
    "rollout/dropped_groups",
    "rollout/response_len/mean",
    "train/pg_loss",
    "train/entropy_loss",
    "train/grad_norm",
    "train/lr",
)


def _argv(tiny_model_dir, task_dir, run_dir: Path, ckpt: Path) -> list[str]:
    return [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--custom-rm-path",
        "tests.e2e.hooks.flaky_digit_reward",
        "--custom-generate-function-path",
        "tests.e2e.hooks.seeded_generate",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "5",
        "--rollout-max-response-len",
        "6",
        "--global-batch-size",
        "20",
        "--micro-batch-size",
        "10",
        "--lr",
        "1e-3",
        "--colocate",
        "--num-rollout",
        str(NUM_ROLLOUT),
        "--save-interval",
        "1",
        "--run-dir",
        str(run_dir),
        "--load",
        str(ckpt),
        "--save",
        str(ckpt),
    ]


def _start(argv, env, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slime", "train", *argv],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        env=env,
        start_new_session=True,
    )


def _kill_everything(proc: subprocess.Popen) -> None:
    """SIGKILL the run and every process under it at once (no clean-up runs anywhere)."""
    family = descendants(proc.pid) | {proc.pid}
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    deadline = time.time() + 30
    while any(alive(p) for p in family) and time.time() < deadline:
        time.sleep(0.2)


def _rows(run_dir: Path) -> dict[int, dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    return {r["rollout_id"]: r for r in map(json.loads, path.read_text().splitlines()) if r["rollout_id"] > 0}


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _assert_whole(ckpt: Path) -> int | None:
    """The tracker names a complete checkpoint (or there is none yet); returns its rollout."""
    if not (ckpt / TRACKER).exists():
        return None
    step = int((ckpt / TRACKER).read_text())
    directory = iter_dir(ckpt, step)
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["rollout_id"] == step
    for name, size in manifest["files"].items():
        assert (directory / name).stat().st_size == size, name
    assert {"rollout_state.json", "trainer_state.pt", "model.safetensors"} <= set(manifest["files"])
    return step


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, task_dir, tmp_path_factory):
    """The uninterrupted run: (its directory, its rows, how long it took)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    whole = root / "whole"
    t0 = time.time()
    proc = _start(_argv(tiny_model_dir, task_dir, whole, whole / "ckpt"), _env(), root / "whole.log")
    assert proc.wait(timeout=400) == 0, (root / "whole.log").read_text()[-3000:]
    run_s = time.time() - t0
    want = _rows(whole)
    assert sorted(want) == list(range(1, NUM_ROLLOUT + 1))
    # 1 reward in 10 raised: FAILED, counted, and the run went on (20 samples: indices 3 and 13)
    assert all(r["rollout/status/failed"] == 2 for r in want.values())
    return whole, want, run_s


@pytest.mark.timeout(1200)  # 4 starts of a run
def test_killed_twice_then_resumed_ends_like_an_uninterrupted_run(uninterrupted, tiny_model_dir, task_dir, tmp_path):
    _killed_and_resumed(KILLS, uninterrupted, tiny_model_dir, task_dir, tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(2400)  # 12 starts of a run: ~15 min on 2 shared, busy cores
def test_killed_ten_times_then_resumed_ends_like_an_uninterrupted_run(
    uninterrupted, tiny_model_dir, task_dir, tmp_path
):
    _killed_and_resumed(SOAK_KILLS, uninterrupted, tiny_model_dir, task_dir, tmp_path)


def _killed_and_resumed(kills, uninterrupted, tiny_model_dir, task_dir, tmp_path) -> None:
    whole, want, run_s = uninterrupted
    base_env = _env()
    ckpt = tmp_path / "ckpt"
    rng = random.Random(0)
    got: dict[int, dict] = {}
    previous = None
    for attempt, (point, where) in enumerate(kills):
        run_dir, halt = tmp_path / f"attempt{attempt}", tmp_path / f"halt{attempt}"
        env = dict(base_env)
        start = previous + 1 if previous is not None else 0  # where this attempt resumes
        if point != "random":
            where = max(where, start)
            env.update({HALT_AT_ENV: f"{point}@{where}", HALT_FILE_ENV: str(halt)})
        log = tmp_path / f"attempt{attempt}.log"
        proc = _start(_argv(tiny_model_dir, task_dir, run_dir, ckpt), env, log)
        # a random moment: in start-up or the first rollouts (the whole uninterrupted run took run_s)
        deadline = time.time() + (rng.uniform(0.15, 0.45) * run_s if point == "random" else 600)
        try:
            while time.time() < deadline and not halt.exists():
                assert proc.poll() is None, f"attempt {attempt} ended before its kill:\n{log.read_text()[-3000:]}"
                time.sleep(0.1)
            assert point == "random" or halt.exists(), f"attempt {attempt} never reached {point}@{where}"
        finally:  # the kill, and on any failure no run left behind
            _kill_everything(proc)
        got.update(_rows(run_dir))
        step = _assert_whole(ckpt)
        assert previous is None or (step is not None and step >= previous), (attempt, previous, step)
        previous = step

    final = tmp_path / "final"
    proc = _start(_argv(tiny_model_dir, task_dir, final, ckpt), base_env, tmp_path / "final.log")
    assert proc.wait(timeout=400) == 0, (tmp_path / "final.log").read_text()[-3000:]
    resumed_from = previous + 1 if previous is not None else 0
    assert sorted(_rows(final)) == list(range(resumed_from + 1, NUM_ROLLOUT + 1))
    got.update(_rows(final))
    assert _assert_whole(ckpt) == NUM_ROLLOUT - 1

    # every rollout that was logged (one killed after its save and before its row may be missing)
    # has the uninterrupted run's metrics, and the last weights are the same
    assert len(got) >= NUM_ROLLOUT - 1
    assert all(key in want[1] for key in COMPARED[:5])
    for rollout_id, row in got.items():
        for key in (k for k in COMPARED if k in want[rollout_id]):
            assert row[key] == pytest.approx(want[rollout_id][key], rel=1e-4, abs=1e-6), (rollout_id, key)
    end, ref = _weights(iter_dir(ckpt, NUM_ROLLOUT - 1)), _weights(iter_dir(whole / "ckpt", NUM_ROLLOUT - 1))
    assert end.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(end[name], ref[name], rtol=1e-4, atol=1e-5, msg=name)
    assert not list(ckpt.glob(".iter_*"))  # no staging directory left behind
