"""slime-rl installed as a package (a built wheel, not the editable checkout) works: every file it
reads at run time is in the wheel, and the `slime` command runs from a fresh environment.

The wheel is built from this checkout and installed with `--no-deps` into a new virtual
environment whose dependencies come from the project's `.venv` (a `.pth` file: installing torch,
transformers and Ray again would take minutes and gigabytes and test nothing of ours). Everything
runs from a directory outside the checkout, so nothing can be imported from the source tree.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from slime.utils.net import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.usefixtures("without_shared_ray")]


def _tracked_package_files() -> set[str]:
    """Files of the `slime` package that git tracks: what an installed package must carry."""
    out = subprocess.run(["git", "ls-files", "slime"], cwd=REPO, capture_output=True, text=True, check=True)
    return {p for p in out.stdout.split() if "/tests/" not in p}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root), str(REPO)],
        check=True,
        capture_output=True,
        cwd=root,
    )
    (wheel,) = root.glob("slime_rl-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies: the project's venv (its editable `slime` hook is a .pth of that directory,
    # which Python does not run for a directory added this way)
    Path(purelib, "_slime_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{os.environ['PATH']}", HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    work = root / "work"
    work.mkdir()
    return {"wheel": wheel, "venv": venv, "purelib": purelib, "env": env, "cwd": work}


def _slime(installed: dict, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(installed["venv"] / "bin" / "slime"), *argv],
        cwd=installed["cwd"],
        env=installed["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_wheel_carries_every_file_the_package_tracks(installed):
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = set(whl.namelist())
    missing = sorted(p for p in _tracked_package_files() if p not in names)
    assert not missing, f"tracked in git but not in the wheel (pyproject.toml's package data): {missing}"


def test_the_installed_package_is_the_one_that_runs(installed):
    out = subprocess.run(
        [str(installed["venv"] / "bin" / "python"), "-c", "import slime; print(slime.__file__)"],
        cwd=installed["cwd"],
        env=installed["env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out.startswith(installed["purelib"]), out
    r = _slime(installed, "train", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--rollout-batch-size" in r.stdout


def test_tiny_model_data_a_two_rollout_run_and_serve_from_the_wheel(installed):
    cwd = installed["cwd"]
    assert _slime(installed, "tiny-model", "--out", "model").returncode == 0
    r = _slime(installed, "make-data", "--out", "data", "--num-train", "64", "--num-eval", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _slime(
        installed,
        "train",
        *("--hf-checkpoint", "model", "--prompt-data", "data/train.jsonl", "--input-key", "prompt"),
        *("--label-key", "label", "--apply-chat-template", "--rm-type", "math", "--num-rollout", "2"),
        *("--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8"),
        *("--global-batch-size", "8", "--micro-batch-size", "8", "--colocate", "--run-dir", "run"),
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    rows = [json.loads(line) for line in (cwd / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["rollout_id"] for row in rows] == [1, 2]  # logged after each rollout's step

    port = free_port("127.0.0.1")
    serve = subprocess.Popen(
        [str(installed["venv"] / "bin" / "slime"), "serve", "--model-path", "model", "--host", "127.0.0.1"]
        + ["--port", str(port), "--num-threads", "1"],
        cwd=cwd,
        env=installed["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        from slime.engine.client import EngineClient

        client = EngineClient(f"http://127.0.0.1:{port}")
        deadline = time.time() + 120
        while not client.health(timeout=1.0):
            assert serve.poll() is None and time.time() < deadline, serve.stdout.read().decode()[-3000:]
            time.sleep(0.5)
        out = client.generate({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        assert out["meta_info"]["completion_tokens"] == 2, out
    finally:
        serve.terminate()
        serve.wait(timeout=30)
