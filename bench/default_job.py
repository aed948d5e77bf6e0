"""Benchmark: the default job end to end (fresh assets), as a user runs it.

    .venv/bin/python bench/default_job.py [--runs 1]

Prints held-out accuracy before SFT, after SFT and after RL, the wall time of each stage
(start-up included) and the mean time per step of each phase. README.md and docs/benchmarks.md ("The default job") quote its output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(workdir: Path) -> dict:
    run_dir = workdir / "run"
    env = {**os.environ, "SLIME_HOME": str(workdir / "home")}
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "slime", "train", "--run-dir", str(run_dir)], env=env, capture_output=True, text=True
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"default job failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["stage"], r["eval/arith"]) for r in rows if "eval/arith" in r]

    def mean(stage: str, key: str) -> float:
        vals = [r[key] for r in rows if r.get("stage") == stage and isinstance(r.get(key), (int, float))]
        return statistics.mean(vals) if vals else float("nan")

    return {
        "wall_s": wall,
        "acc_before": evals[0][1],
        "acc_after_sft": [a for s, a in evals if s == "sft"][-1],
        "acc_final": evals[-1][1],
        "sft_s": max(r["time"] for r in rows if r["stage"] == "sft"),
        "rl_s": max(r["time"] for r in rows if r["stage"] == "rl"),
        "rl_steps": sum(1 for r in rows if r["stage"] == "rl" and "perf/step_time" in r),
        **{f"rl_{k}": mean("rl", f"perf/{k}_time") for k in ("step", "rollout", "train", "update_weights")},
        "sft_step": mean("sft", "perf/step_time"),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1)
    n = p.parse_args().runs
    results = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as d:
            results.append(run_once(Path(d)))
    print(f"default job, {os.cpu_count()} cores, {n} run(s)")
    print(
        "| run | wall (s) | eval before SFT | after SFT | after RL | RL gain | SFT stage (s) | RL stage (s) "
        "| RL s/step | rollout | train | weight sync |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(results):
        print(
            f"| {i} | {r['wall_s']:.0f} | {r['acc_before']:.3f} | {r['acc_after_sft']:.3f} | {r['acc_final']:.3f} "
            f"| {r['acc_final'] - r['acc_after_sft']:+.3f} | {r['sft_s']:.0f} | {r['rl_s']:.0f} "
            f"| {r['rl_step']:.3f} | {r['rl_rollout']:.3f} | {r['rl_train']:.3f} | {r['rl_update_weights']:.3f} |"
        )


if __name__ == "__main__":
    main()
