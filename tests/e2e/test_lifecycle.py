"""Process lifecycle: several ranks and engines, resume from a checkpoint (runs in the session's
shared Ray cluster), Ctrl-C of `slime train` leaves no orphans (a process of its own)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.sync.shm import buffers as shm_buffers
from tests.helpers import alive, descendants

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _base(tiny_model_dir, task_dir, run_dir) -> list[str]:
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
        "tests.e2e.hooks.digit_reward",
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "32",
        "--micro-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--colocate",
        "--run-dir",
        str(run_dir),
    ]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(argv) -> None:
    """One run in this process, in the shared Ray cluster."""
    from slime.arguments import parse_args
    from slime.train import train

    train(parse_args(argv))


def test_two_fsdp_ranks_and_two_engines_behind_the_router(ray_cluster, tiny_model_dir, task_dir, tmp_path):
    """--actor-num-gpus-per-node 2 --colocate: two gloo/FSDP2 ranks and two engines behind sglang-router
    (with slime's --balance-data: the ranks take token-balanced shares of each rollout)."""
    run_dir = tmp_path / "run"
    _train(
        _base(tiny_model_dir, task_dir, run_dir)
        + ["--num-rollout", "2", "--actor-num-gpus-per-node", "2", "--check-weight-update-equal", "--balance-data"]
    )
    rows = _rows(run_dir)
    assert len(rows) == 2
    for r in rows:
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-4
        assert r["train/train_rollout_logprob_abs_diff"] < 1e-4
        assert r["rollout/status/failed"] == 0 and r["rollout/num_samples"] == 32
    assert (run_dir / "logs" / "engine_1.log").exists() and (run_dir / "logs" / "router.log").exists()


def test_resume_from_checkpoint_with_the_data_buffer(ray_cluster, tiny_model_dir, task_dir, tmp_path, capsys):
    """--partial-rollout with over-sampling: 12 groups start, 8 are used, the other 4 wait in the Data
    Buffer, which is saved with the checkpoint and served first after --load. Along the way: prompts over
    --rollout-max-prompt-len are dropped and counted, a --rollout-sample-filter-path removes samples, and
    eval reports pass@k."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = (task_dir / "train.jsonl").read_text().splitlines()
    longest = max(
        len(
            tok.encode(
                tok.apply_chat_template(
                    [{"role": "user", "content": json.loads(r)["prompt"]}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            )
        )
        for r in rows
    )
    data = tmp_path / "train.jsonl"  # the task plus three prompts far over the limit
    data.write_text("\n".join(rows + [json.dumps({"prompt": "x" * 400, "label": "0"})] * 3) + "\n")

    def argv(run_dir):
        base = _base(tiny_model_dir, task_dir, run_dir)
        base[base.index("--prompt-data") + 1] = str(data)
        return base + [
            "--partial-rollout",
            "--over-sampling-batch-size",
            "12",
            "--rollout-max-prompt-len",
            str(longest),
            "--rollout-sample-filter-path",
            "tests.contracts.hooks.remove_odd_samples",
        ]

    first, second = tmp_path / "first", tmp_path / "second"
    shm_before = shm_buffers()
    _train(
        argv(first)
        + [
            "--num-rollout",
            "2",
            "--save-interval",
            "1",
            "--eval-interval",  # slime evaluates on an interval only
            "2",
            "--eval-prompt-data",
            "arith",
            str(task_dir / "eval.jsonl"),
            "--n-samples-per-eval-prompt",
            "4",
            "--skip-eval-before-train",
        ]
    )
    for r in _rows(first):
        assert r["rollout/data/dropped_long_prompts"] == 3
        assert r["rollout/removed_samples"] == 16  # the odd half of 32 samples
        assert r["rollout/buffer/returned_groups"] == 4 and r["rollout/num_samples"] == 32
    assert _rows(first)[1]["rollout/buffer/resumed_groups"] == 4  # rollout 1 started with rollout 0's tail
    last = _rows(first)[-1]
    assert 0 <= last["eval/arith/pass@1"] <= last["eval/arith/pass@2"] <= last["eval/arith/pass@4"] <= 1
    state = json.loads((first / "checkpoints" / "iter_0000001" / "rollout_state.json").read_text())
    assert len(state["buffer"]) == 4 and all(len(g) == 4 for g in state["buffer"])

    _train(
        argv(second)
        + ["--num-rollout", "3", "--load", str(first / "checkpoints"), "--save", str(second / "checkpoints")]
        + ["--save-interval", "1"]  # slime saves only on an interval
    )
    rows = _rows(second)
    assert [r["rollout_id"] for r in rows] == [3]  # only the third rollout ran
    assert rows[0]["rollout/buffer/resumed_groups"] == 4  # the saved buffer was served first
    resumed = json.loads((second / "checkpoints" / "iter_0000002" / "rollout_state.json").read_text())
    # The data source continued from the saved position: 4 buffered groups + 8 new prompts.
    assert resumed["group_counter"] == state["group_counter"] + 8

    # Resumed into its own run directory, the run appends cleanly: each rollout once, steps continuing.
    capsys.readouterr()
    _train(
        argv(first) + ["--num-rollout", "3", "--load", str(first / "checkpoints"), "--save", str(first / "checkpoints")]
    )
    # rows are logged after each rollout's step, as rollout_id + 1: the resumed run's one row is 3
    assert [(r["rollout_id"], r["global_step"]) for r in _rows(first)] == [(1, 1), (2, 2), (3, 3)]
    assert f"resumed from {first / 'checkpoints' / 'iter_0000001'}: training continues at rollout 2" in (
        capsys.readouterr().out
    )
    assert shm_buffers() <= shm_before, "a run left its /dev/shm weight buffer behind"


def test_ctrl_c_leaves_no_process_behind(tiny_model_dir, task_dir, tmp_path):
    run_dir = tmp_path / "run"
    stderr_path = tmp_path / "stderr.txt"  # a file, not a pipe: the child can never block on a full pipe
    # SIGINT back to its default in the child: a suite launched in the background (`cmd &`, nohup)
    # runs with SIGINT ignored, and an ignored signal stays ignored across exec
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime", "train", *_base(tiny_model_dir, task_dir, run_dir), "--num-rollout", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=open(stderr_path, "w"),
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def stderr_tail() -> str:
        return stderr_path.read_text(errors="replace")[-4000:]

    shm_before = shm_buffers()
    try:
        deadline = time.time() + 180
        while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text():
            assert proc.poll() is None, stderr_tail()
            assert time.time() < deadline, "no training step within 180 s"
            time.sleep(0.5)
        family = descendants(proc.pid)
        engines = [p for p in family if "slime.engine.server" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")]
        assert engines, "the engine server should be running"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`slime train` did not exit within 90 s of Ctrl-C; its stderr:\n{stderr_tail()}"
            ) from None
        assert proc.returncode == 130, stderr_tail()
        assert "interrupted" in stderr_tail()
        # where to pick up (the run saves under its run directory; interrupted before its first save)
        assert f"[slime] interrupted; no complete checkpoint under --save {run_dir / 'checkpoints'}" in stderr_tail()
        deadline = time.time() + 30
        while any(alive(p) for p in family) and time.time() < deadline:
            time.sleep(0.5)
        assert not [p for p in family if alive(p)], "processes outlived `slime train`"
        assert shm_buffers() <= shm_before, "the interrupted run left its /dev/shm weight buffer behind"
    finally:
        if proc.poll() is None:
            proc.kill()
