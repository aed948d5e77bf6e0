"""Atomic checkpoints: a save is staged, flushed, listed in a manifest, renamed into place, and only
then named by the tracker; a process killed (SIGKILL, a real process) inside the commit leaves the
tracker naming the previous complete checkpoint. `--load` of a half-written, damaged or foreign
checkpoint stops, naming what is wrong; the trainer's `.pt` files load with `weights_only=True`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from slime.checkpoint_sources import resolve_checkpoints
from slime.data.data_source import RolloutDataSourceWithBuffer, resume
from slime.errors import SlimeError
from slime.utils.checkpoint_layout import (
    HALT_AT_ENV,
    HALT_FILE_ENV,
    MANIFEST,
    ROLLOUT_STATE_FILE,
    TRACKER,
    TRAINER_STATE_FILE,
    check_complete,
    commit,
    iter_dir,
    latest_dir,
    staging_dir,
)
from tests.helpers import make_args


def _stage(save, rollout_id, *, rollout_state=True, weights=None):
    d = staging_dir(save, rollout_id)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file(weights or {"w": torch.full((4,), float(rollout_id))}, str(d / "model.safetensors"))
    torch.save({"rollout_id": rollout_id, "rng": torch.get_rng_state()}, d / TRAINER_STATE_FILE)
    if rollout_state:
        (d / ROLLOUT_STATE_FILE).write_text(json.dumps({"offset": rollout_id}))
    return d


COMMIT = "import sys; from slime.utils.checkpoint_layout import commit; commit(sys.argv[1], int(sys.argv[2]))"


def _commit_killed_at(save, rollout_id, point, tmp_path):
    """`commit` in its own process, SIGKILLed once it reaches `point`."""
    halt = tmp_path / f"halt-{point}"
    env = {**os.environ, HALT_AT_ENV: f"{point}@{rollout_id}", HALT_FILE_ENV: str(halt)}
    proc = subprocess.Popen([sys.executable, "-c", COMMIT, str(save), str(rollout_id)], env=env)
    deadline = time.time() + 60
    while not halt.exists():
        assert proc.poll() is None and time.time() < deadline, "commit never reached " + point
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_the_tracker_moves_only_after_the_checkpoint_is_whole(tmp_path):
    save = tmp_path / "ckpt"
    _stage(save, 0)
    assert commit(save, 0) == iter_dir(save, 0)
    assert (save / TRACKER).read_text() == "0\n" and not staging_dir(save, 0).exists()
    manifest = json.loads((iter_dir(save, 0) / MANIFEST).read_text())
    assert (
        manifest["rollout_id"] == 0
        and manifest["files"]["model.safetensors"] == (iter_dir(save, 0) / "model.safetensors").stat().st_size
    )
    assert set(manifest["files"]) == {"config.json", "model.safetensors", TRAINER_STATE_FILE, ROLLOUT_STATE_FILE}

    _stage(save, 1)
    _commit_killed_at(save, 1, "staged", tmp_path)  # flushed and listed, not yet renamed
    assert latest_dir(save) == iter_dir(save, 0) and not iter_dir(save, 1).exists()
    check_complete(latest_dir(save), "--load")
    _commit_killed_at(save, 1, "renamed", tmp_path)  # in place, the tracker not yet replaced
    assert latest_dir(save) == iter_dir(save, 0) and (iter_dir(save, 1) / MANIFEST).exists()

    # the resumed run saves rollout 1 again: the new one replaces it, nothing is left behind
    _stage(save, 1, weights={"w": torch.full((4,), 7.0)})
    commit(save, 1)
    assert latest_dir(save) == iter_dir(save, 1)
    check_complete(iter_dir(save, 1), "--load")
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000000", "iter_0000001", TRACKER]


# ---------------------------------------------------------------- --load refuses what is not whole


def _resolve(tiny_model_dir, save, *argv):
    args = make_args("--hf-checkpoint", str(tiny_model_dir), "--load", str(save), *argv)
    return resolve_checkpoints(args, json.loads((tiny_model_dir / "config.json").read_text()))


@pytest.fixture()
def ckpt(tmp_path):
    save = tmp_path / "ckpt"
    _stage(save, 3)
    commit(save, 3)
    return save


def test_a_complete_checkpoint_is_resumed(tiny_model_dir, ckpt):
    assert _resolve(tiny_model_dir, ckpt) == []


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / MANIFEST).unlink(), "has no checkpoint_manifest.json, so it is not a complete checkpoint"),
        (lambda d: (d / TRAINER_STATE_FILE).unlink(), r"trainer_state.pt \(the trainer state .*\) is missing"),
        (
            lambda d: (d / ROLLOUT_STATE_FILE).unlink(),
            r"rollout_state.json \(the data position and Data Buffer\) is miss",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\0" * 10),
            r"damaged: model.safetensors \(the model weights\) "
            r"has 10 bytes",
        ),
        (lambda d: (d / MANIFEST).write_text('{"format": "other"}'), "is not a slime-rl checkpoint manifest"),
        (lambda d: (d.parent / TRACKER).write_text("release"), "holds 'release', not a rollout id"),
        (lambda d: (d.parent / TRACKER).write_text("9"), "iter_0000009 does not exist"),
    ],
)
def test_a_half_written_or_foreign_checkpoint_stops_naming_what_is_wrong(tiny_model_dir, ckpt, damage, message):
    damage(iter_dir(ckpt, 3))
    with pytest.raises(SlimeError, match=message) as e:
        _resolve(tiny_model_dir, ckpt)
    assert f"--load {ckpt}" in str(e.value)


def test_a_checkpoint_without_the_data_state_stops_when_the_data_resumes_from_it(tiny_model_dir, tmp_path):
    save = tmp_path / "ckpt"
    _stage(save, 2, rollout_state=False)
    commit(save, 2)
    with pytest.raises(SlimeError, match=r"has no rollout_state.json \(the data position and Data Buffer\)"):
        _resolve(tiny_model_dir, save)
    assert _resolve(tiny_model_dir, save, "--start-rollout-id", "0") == []  # the data starts over: not needed
    # and the rollout side refuses it too, rather than starting the data at its beginning
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    args = make_args(prompt_data=str(prompts), input_key="prompt", load=str(save))
    with pytest.raises(SlimeError, match="has no rollout_state.json"):
        resume(RolloutDataSourceWithBuffer(args), args)


# ---------------------------------------------------------------- the trainer's side


def _actor(tiny_model_dir, run_dir, *extra):
    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "3",
            "--lr",
            "1e-2",
            "--micro-batch-size",
            "4",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor


DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11, 3], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 3, 2, 3],
    "loss_masks": [[1, 1], [1, 0, 1], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}


class _NotPlain:  # a pickled object: what weights_only=True refuses to run
    pass


def test_trainer_checkpoints_load_weights_only_and_foreign_ones_stop(tiny_model_dir, tmp_path):
    save = tmp_path / "ckpt"
    actor = _actor(tiny_model_dir, tmp_path / "a", "--save", str(save), "--advantage-estimator", "ppo")
    actor.train(0, json.loads(json.dumps(DATA)))
    staged = actor.save(0)
    assert staged == str(staging_dir(save, 0)) and not (save / TRACKER).exists()  # the driver commits
    for name in (TRAINER_STATE_FILE, "critic_state.pt"):  # optimizer, schedule, RNG: tensors and plain types
        assert isinstance(torch.load(f"{staged}/{name}", weights_only=True), dict)
    commit(save, 0)
    back = _actor(tiny_model_dir, tmp_path / "b", "--load", str(save), "--advantage-estimator", "ppo")
    for (n, w), (_, v) in zip(actor.model.named_parameters(), back.model.named_parameters(), strict=True):
        assert torch.equal(w, v), n

    # weights of another model, in a checkpoint that is otherwise whole
    other = tmp_path / "other"
    d = _stage(other, 0, weights={"model.embed_tokens.weight": torch.zeros(3, 3), "extra.weight": torch.zeros(1)})
    torch.save(torch.load(f"{save}/iter_0000000/{TRAINER_STATE_FILE}", weights_only=True), d / TRAINER_STATE_FILE)
    commit(other, 0)
    with pytest.raises(
        SlimeError,
        match=r"does not hold the weights of --hf-checkpoint's model: .*missing.*"
        r"extra.weight.*shapes differ: model.embed_tokens.weight \(3, 3\)",
    ):
        _actor(tiny_model_dir, tmp_path / "c", "--load", str(other))

    # a trainer state holding a pickled object is not run: refused, named
    evil = tmp_path / "evil"
    d = _stage(evil, 0)
    for f in (iter_dir(save, 0)).glob("*.safetensors"):
        (d / f.name).write_bytes(f.read_bytes())
    torch.save({"rollout_id": 0, "rng": torch.get_rng_state(), "x": _NotPlain()}, d / TRAINER_STATE_FILE)
    commit(evil, 0)
    with pytest.raises(SlimeError, match=r"cannot read .*trainer_state.pt as a slime-rl state file"):
        _actor(tiny_model_dir, tmp_path / "d", "--load", str(evil))
