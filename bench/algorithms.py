"""Benchmark: every advantage estimator on the bundled addition task, from one shared SFT warm start.

    .venv/bin/python bench/algorithms.py [--num-rollout 100] [--estimators grpo ppo ...]

Builds the default job's tiny model and data (in a temporary SLIME_HOME unless one is set), runs the
default job's SFT stage once, then, for each estimator, an RL run of fixed length with the default
job's RL settings (32 prompts x 8 samples, lr 3e-4). Prints held-out greedy accuracy (`eval/arith`)
after SFT and after RL (mean of the last two evaluations: single evaluations swing by 10+ points)
and the mean time per step (rollout + train + weight sync) as a table. docs/benchmarks.md ("Every estimator") quotes its output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXTRA = {  # per-estimator settings beyond the default job's RL stage
    "grpo": [],
    "gspo": ["--eps-clip", "3e-4", "--eps-clip-high", "4e-4"],  # GSPO's sequence-ratio clip range
    "reinforce_plus_plus": ["--normalize-advantages"],
    "reinforce_plus_plus_baseline": ["--normalize-advantages"],
    "rloo": [],
    "ppo": ["--lambd", "0.95", "--critic-lr", "1e-3", "--num-critic-only-steps", "5", "--normalize-advantages"],
}


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-rollout", type=int, default=100)
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--estimators", nargs="+", default=list(EXTRA), choices=list(EXTRA))
    p.add_argument("--seed", type=int, default=1234)
    opts = p.parse_args()
    os.environ.setdefault("SLIME_HOME", tempfile.mkdtemp(prefix="slime-bench-"))

    from slime.arguments import parse_args, to_argv
    from slime.default_job import COMMON, RL, SFT, assets_dir, ensure_assets
    from slime.train import shutdown, train

    model_dir, data_dir = ensure_assets(assets_dir())
    work = Path(tempfile.mkdtemp(prefix="bench-algorithms-"))
    base = to_argv(COMMON) + ["--eval-prompt-data", "arith", str(data_dir / "eval.jsonl"), "--seed", str(opts.seed)]
    t0 = time.time()
    sft = parse_args(
        base
        + to_argv(SFT)
        + [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(data_dir / "sft.jsonl"),
            "--run-dir",
            str(work / "sft"),
        ]
    )
    try:
        train(sft)
    finally:
        shutdown()
    sft_ckpt = Path(sft.save) / f"iter_{sft.num_rollout - 1:07d}"
    sft_acc = [r["eval/arith"] for r in _rows(work / "sft") if "eval/arith" in r][-1]
    print(f"SFT warm start: {time.time() - t0:.0f} s, held-out accuracy {sft_acc:.3f}", flush=True)

    results = []
    for est in opts.estimators:
        rl = dict(RL, num_rollout=opts.num_rollout, eval_interval=opts.eval_interval, advantage_estimator=est)
        run_dir = work / est
        args = parse_args(
            base
            + to_argv(rl)
            + EXTRA[est]
            + [
                "--hf-checkpoint",
                str(sft_ckpt),
                "--prompt-data",
                str(data_dir / "train.jsonl"),
                "--skip-eval-before-train",
                "--run-dir",
                str(run_dir),
            ]
        )
        t1 = time.time()
        try:
            train(args)
        except Exception as e:  # noqa: BLE001 - one failing estimator must not lose the others' results
            results.append((est, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"))
            print(f"{est}: FAILED ({e})", flush=True)
            continue
        finally:
            shutdown()
        rows = _rows(run_dir)
        evals = [r["eval/arith"] for r in rows if "eval/arith" in r]
        steps = [r for r in rows if "perf/step_time" in r]
        results.append(
            (
                est,
                evals,
                statistics.mean(r["perf/step_time"] for r in steps),
                statistics.mean(r["perf/train_time"] for r in steps),
                time.time() - t1,
            )
        )
        print(f"{est}: done in {time.time() - t1:.0f} s", flush=True)

    print(
        f"\n{len(opts.estimators)} estimators, {opts.num_rollout} rollouts each (32 prompts x 8 samples), "
        f"from one SFT warm start ({sft_acc:.3f}); {os.cpu_count()} cores"
    )
    print(
        "| estimator | held-out after SFT | after RL (mean of last 2 evals) | gain | s/step | train s/step | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for est, *res in results:
        if len(res) == 1:
            print(f"| {est} | {sft_acc:.3f} | {res[0]} | | | | |")
            continue
        evals, step, train_s, wall = res
        final = statistics.mean(evals[-2:]) if evals else float("nan")
        print(
            f"| {est} | {sft_acc:.3f} | {final:.3f} | {final - sft_acc:+.3f} | {step:.3f} | {train_s:.3f} | {wall:.0f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
