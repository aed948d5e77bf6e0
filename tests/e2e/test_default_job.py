"""The default job (`slime train`, no arguments) visibly learns: the headline claim of README.md
(figures in docs/benchmarks.md, "The default job").

Takes ~3.5 minutes on 2 idle cores; select or skip it with `-m slow` / `-m "not slow"`.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_default_job_learns(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "SLIME_HOME": str(tmp_path / "home")}  # fresh assets: built by the job itself
    proc = subprocess.run(
        [sys.executable, "-m", "slime", "train", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1100,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"metrics: {(run_dir / 'metrics.jsonl').resolve()}" in proc.stdout
    assert f"plot:    {(run_dir / 'metrics.png').resolve()}" in proc.stdout

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in rows} == {"sft", "rl"}
    evals = [(r["stage"], r["eval/arith"]) for r in rows if "eval/arith" in r]
    before_sft = evals[0]
    between = [e for e in evals if e[0] == "sft"][-1]
    final = evals[-1]
    assert before_sft[0] == "sft" and final[0] == "rl"
    print(f"eval/arith: before SFT {before_sft[1]:.3f}, after SFT {between[1]:.3f}, after RL {final[1]:.3f}")
    assert final[1] - before_sft[1] >= 0.40, evals
    assert final[1] - between[1] >= 0.30, evals  # the RL stage by itself
    assert between[1] < 0.5, "the SFT warm start should stop well below mastery"
    assert (run_dir / "metrics.png").stat().st_size > 10_000
    assert (run_dir / "checkpoints" / "rl" / "latest_checkpointed_iteration.txt").exists()
