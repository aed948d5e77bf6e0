"""Bad input stops before any process starts, with a message naming what to fix."""

import os
import subprocess
import sys

import pytest
import ray

from slime.train import main

# each test checks that no Ray cluster was started: none may be up from an earlier module
pytestmark = pytest.mark.usefixtures("without_shared_ray")


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ", 1)[1].split()[1] == me:
                        out.add(int(pid))
            except OSError:
                pass
    return out


@pytest.fixture
def argv(tiny_model_dir, task_dir, tmp_path):
    return [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--rm-type",
        "math",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "8",
        "--run-dir",
        str(tmp_path / "run"),
    ]


def _replace(argv, flag, value):
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def _fails_early(argv, capsys, *expected):
    before = _children()
    assert main(argv) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert "Traceback" not in err
    assert not ray.is_initialized()
    assert _children() <= before, "a process was launched before the error"
    return err


def test_missing_checkpoint(argv, capsys, tmp_path):
    _fails_early(
        _replace(argv, "--hf-checkpoint", str(tmp_path / "nope")), capsys, "--hf-checkpoint", "not a directory"
    )


def test_checkpoint_without_config(argv, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    _fails_early(_replace(argv, "--hf-checkpoint", str(tmp_path / "empty")), capsys, "no config.json")


def test_malformed_jsonl_line_names_file_and_line(argv, capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "label": "2"}\n{"prompt": "2+2=", "label": \n')
    _fails_early(_replace(argv, "--prompt-data", str(bad)), capsys, str(bad), "line 2")


def test_missing_input_key(argv, capsys, task_dir):
    _fails_early(_replace(argv, "--input-key", "question"), capsys, "question", "train.jsonl", "line 1")


def test_missing_label_key(argv, capsys):
    _fails_early(_replace(argv, "--label-key", "answer"), capsys, "answer", "line 1")


def test_unknown_rm_type(argv, capsys):
    _fails_early(_replace(argv, "--rm-type", "maths"), capsys, "maths", "math")


def test_indivisible_global_batch(argv, capsys):
    _fails_early(argv + ["--global-batch-size", "3"], capsys, "--global-batch-size (3)")


def test_unknown_engine_passthrough(argv, capsys):
    _fails_early(argv + ["--sglang-dtyp", "bfloat16"], capsys, "--sglang-dtyp", "--sglang-dtype")


def test_bad_hook_path(argv, capsys):
    _fails_early(argv + ["--custom-rm-path", "no_such_module.reward"], capsys, "--custom-rm-path", "no_such_module")


def test_cli_prints_one_clean_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slime",
            "train",
            "--hf-checkpoint",
            str(tmp_path / "missing"),
            "--prompt-data",
            "x.jsonl",
            "--rollout-batch-size",
            "1",
            "--num-rollout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("slime: error: --hf-checkpoint") and "Traceback" not in proc.stderr


def test_response_longer_than_the_context(argv, capsys):
    _fails_early(
        argv + ["--rollout-max-response-len", "4096"], capsys, "--rollout-max-response-len 4096", "context length 256"
    )


def test_prompt_limit_that_leaves_nothing(argv, capsys):
    _fails_early(
        argv + ["--rollout-max-prompt-len", "2"], capsys, "holds no prompts", "longer than --rollout-max-prompt-len 2"
    )


def test_over_sampling_without_a_reason_to_over_sample(argv, capsys):
    _fails_early(
        argv + ["--over-sampling-batch-size", "8"],
        capsys,
        "--over-sampling-batch-size only applies with --dynamic-sampling-filter-path or --partial-rollout",
    )
    _fails_early(argv + ["--mask-offpolicy-in-partial-rollout"], capsys, "needs --partial-rollout")


def test_bad_buffer_filter_path(argv, capsys):
    _fails_early(
        argv + ["--buffer-filter-path", "tests.contracts.hooks.custom_rm"],
        capsys,
        "--buffer-filter-path tests.contracts.hooks.custom_rm: signature",
    )
