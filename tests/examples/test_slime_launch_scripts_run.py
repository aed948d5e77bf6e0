"""slime's fully-async and on-policy-distillation examples are launch scripts only (their Python is
slime's own modules, which this repository provides under the same paths). Here the scripts
themselves run, as slime's README says to run them (`bash examples/.../run-*.sh`), at a CPU test's
size (tests/examples/slime_replay.py: the tiny model, local data, small rollouts); everything else
on their command lines is theirs. Skipped where the mirror of slime is not on this machine."""

from __future__ import annotations

import math

import pytest

from tests.examples.slime_mirror import train_from_tree
from tests.examples.slime_replay import replay

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A second tiny model (other weights, the same tokenizer): the distillation teacher."""
    from slime.data.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("teacher"), seed=1)


def finite_rows(rows: list[dict], *keys: str) -> None:
    assert len(rows) == 2, rows
    for r in rows:
        assert r["rollout/status/failed"] == 0 and r["rollout/num_samples"] == 8
        for key in ("train/pg_loss", *keys):
            assert math.isfinite(r[key]), key


def test_fully_async_script(tiny_model_dir, task_dir, tmp_path):
    """run-qwen2.5-0.5B-fully_async.sh: train_async.py with slime's fully-async rollout function."""
    run = replay(tmp_path, "examples/fully_async/run-qwen2.5-0.5B-fully_async.sh", model=tiny_model_dir,
                 data=task_dir / "train.jsonl")  # fmt: skip
    assert run.command == "train-async"
    assert "slime.rollout.fully_async_rollout.generate_rollout_fully_async" in run.argv
    rows = train_from_tree(run.tree, run.argv, tmp_path / "run", run.command)
    finite_rows(rows, "rollout/raw_reward", "rollout/fully_async/queue_size")  # the fully-async worker's


def test_on_policy_distillation_script_with_its_teacher_server(tiny_model_dir, teacher_dir, task_dir, tmp_path):
    """run-qwen3-8B-opd.sh: the script starts its teacher with `python -m sglang.launch_server
    ... --tp 1 --chunked-prefill-size 4096 --mem-fraction-static 0.6` (here `slime serve` with those
    arguments) and points `--rm-url` at it; slime's distillation hooks score every sample by the
    teacher's log-probs, and the student is trained toward a teacher with other weights."""
    run = replay(tmp_path, "examples/on_policy_distillation/run-qwen3-8B-opd.sh", model=tiny_model_dir,
                 data=task_dir / "train.jsonl", server_model=teacher_dir)  # fmt: skip
    try:
        (teacher,) = run.servers
        note = teacher.log_path.read_text()
        assert "not used by this engine: --tp 1; --chunked-prefill-size 4096" in note
        assert run.argv[run.argv.index("--rm-url") + 1] == teacher.url + "/generate"
        rows = train_from_tree(run.tree, run.argv, tmp_path / "run", run.command)
    finally:
        run.stop()
    finite_rows(rows, "train/opd_reverse_kl")
    assert all(r["rollout/raw_reward"] == 0.0 for r in rows)  # the signal is the distillation term alone
    assert all(abs(r["train/opd_reverse_kl"]) > 1e-3 for r in rows)  # a teacher with other weights


def test_on_policy_distillation_script_on_megatron(tiny_model_dir, teacher_dir, task_dir, tmp_path):
    """run-qwen3-8B-opd-megatron.sh on slime's own backend (slime's default `--train-backend`):
    the teacher a frozen GPTModel beside the student (`--opd-type megatron --opd-teacher-load`),
    split with the script's `--tensor-model-parallel-size 2 --sequence-parallel` and full
    recomputation over two trainer ranks (colocated with the engine: three processes on two cores
    would not be placed)."""
    run = replay(tmp_path, "examples/on_policy_distillation/run-qwen3-8B-opd-megatron.sh", model=tiny_model_dir,
                 data=task_dir / "train.jsonl", paths={"--opd-teacher-load": str(teacher_dir)},
                 size={"--actor-num-gpus-per-node": "2", "--train-backend": "megatron"},
                 flags=("--colocate",))  # fmt: skip
    for option in ("--tensor-model-parallel-size", "--sequence-parallel", "--recompute-granularity"):
        assert option in run.argv
    rows = train_from_tree(run.tree, run.argv, tmp_path / "run", run.command)
    finite_rows(rows, "train/opd_reverse_kl")
    assert all(abs(r["train/opd_reverse_kl"]) > 1e-3 for r in rows)
