"""slime's own examples, read from a local mirror of THUDM/slime (skipped where it is absent): the
tree extracted as it is, and `slime train` run from it the way slime's launch scripts run train.py
(slime's tree first on PYTHONPATH, so `examples` is slime's package, not this repository's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIRROR = Path("/work/.mirror/THUDM+slime/repo")


def extract(dest: Path, *paths: str) -> Path:
    """`git archive` of `paths` at the mirror's HEAD into `dest`; skips the test without a mirror."""
    if not MIRROR.exists():
        pytest.skip("no local mirror of THUDM/slime")
    archive = subprocess.run(["git", "-C", str(MIRROR), "archive", "HEAD", *paths], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def train_from_tree(tree: Path, argv: list[str], run_dir: Path, command: str = "train") -> list[dict]:
    """`python -m slime <command> argv` (train, or train-async) from slime's extracted tree; the
    run's metrics rows."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-m", "slime", command, *argv, "--run-dir", str(run_dir)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
