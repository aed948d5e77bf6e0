"""Benchmark: rollouts per minute of each way to run the RL loop, side by side in one run.

    .venv/bin/python bench/modes.py [--quick] [--num-rollout 8] [--model small]

The same model, task and batch in every mode (GRPO on the bundled addition task, one optimizer
step per rollout), each a real `python -m slime ...` run in its own process (Ray, an engine
server process, the trainer), one after the other:

* colocated sync: `slime train --colocate`: engine and trainer take turns, each on every core;
* disaggregated sync: `slime train`, the engine on one core and the trainer on another;
* train_async: `slime train-async`, the same placement: rollout k+1 generates while step k trains;
* fully async: `slime train --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout`,
  the same placement: generation never stops (queue of 2 batches).

Rollouts per minute = 60 x steps / their summed `perf/step_time`, the first step (warm-up) and
the last (it saves the checkpoint) left out; the table also gives the mean time the loop waited
for a rollout, trained and synced weights per step, and the staleness of the data. Then it calls
`bench/weight_sync.py`'s `run` (weight-sync time per transport), when that file is there.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]

MODELS = {  # build_tiny_model shapes
    "tiny": dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192
    ),
    "small": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768
    ),
}

SPLIT = ["--train-num-threads", "1", "--sglang-num-threads", "1"]  # one core each (2-core machine)
MODES = {
    "colocated sync": ("train", ["--colocate"]),
    "disaggregated sync": ("train", SPLIT),
    "train_async": ("train-async", SPLIT),
    "fully async": ("train", SPLIT + ["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout"]),
}


def job_args(model: Path, data: Path, run_dir: Path, num_rollout: int, batch: int, n: int, resp_len: int) -> list[str]:
    return [
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(data / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--advantage-estimator",
        "grpo",
        "--lr",
        "1e-4",
        "--num-rollout",
        str(num_rollout),
        "--rollout-batch-size",
        str(batch),
        "--n-samples-per-prompt",
        str(n),
        "--rollout-max-response-len",
        str(resp_len),
        "--global-batch-size",
        str(batch * n),
        "--micro-batch-size",
        str(batch * n),
        "--seed",
        "1",
        "--run-dir",
        str(run_dir),
    ]


def run_mode(name: str, base: list[str], run_dir: Path) -> dict:
    command, extra = MODES[name]
    env = {**os.environ, "SLIME_FULLY_ASYNC_QUEUE_SIZE": str(2 * int(base[base.index("--rollout-batch-size") + 1]))}
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "slime", command, *base, *extra], cwd=REPO, env=env, capture_output=True, text=True
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_time" in r][1:-1]

    def mean(key: str) -> float:
        vals = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
        return statistics.mean(vals) if vals else float("nan")

    staleness_key = next(
        (k for k in ("rollout/staleness/mean", "rollout/fully_async/staleness_mean") if any(k in r for r in steps)),
        None,
    )
    return {
        "mode": name,
        "wall_s": wall,
        "steps": len(steps),
        "rollouts_per_min": 60.0 * len(steps) / sum(r["perf/step_time"] for r in steps),
        "wait": mean("perf/rollout_wait_time"),
        "rollout": mean("perf/rollout_time"),
        "train": mean("perf/train_time"),
        "sync": mean("perf/update_weights_time"),
        "staleness": mean(staleness_key) if staleness_key else float("nan"),
        "reward": mean("rollout/raw_reward"),
    }


def weight_sync_bench(quick: bool) -> None:
    """bench/weight_sync.py's `run` (another part of the benchmark), when it is there."""
    path = Path(__file__).with_name("weight_sync.py")
    if not path.is_file():
        print("\nweight sync: bench/weight_sync.py is not there yet; skipped")
        return
    spec = importlib.util.spec_from_file_location("bench_weight_sync", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = getattr(module, "run", None)
    if run is None:
        print("\nweight sync: bench/weight_sync.py has no run(); skipped")
        return
    kwargs = {"quick": quick} if "quick" in inspect.signature(run).parameters else {}
    print("\nweight sync (bench/weight_sync.py):", flush=True)
    run(**kwargs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer rollouts (a smoke test)")
    p.add_argument("--num-rollout", type=int, default=10)
    p.add_argument("--model", choices=list(MODELS), default="small")
    p.add_argument("--rollout-batch-size", type=int, default=16)
    p.add_argument("--n-samples-per-prompt", type=int, default=8)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--no-weight-sync", action="store_true", help="skip bench/weight_sync.py")
    a = p.parse_args()
    num_rollout = 4 if a.quick else a.num_rollout

    sys.path.insert(0, str(REPO))
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    bf16 = "avx512_bf16" in cpu
    results = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = build_tiny_model(work / "model", **MODELS[a.model])
        write_arithmetic_dataset(work / "data", difficulty=2, num_eval=32, seed=0)
        for name in a.modes:
            run_dir = work / name.replace(" ", "_")
            base = job_args(
                model, work / "data", run_dir, num_rollout, a.rollout_batch_size, a.n_samples_per_prompt, a.response_len
            )
            print(f"running {name} ...", flush=True)
            results.append(run_mode(name, base, run_dir))

    params = {"tiny": "0.12M", "small": "~3.5M"}[a.model]
    print(
        f"\nmodes: {a.model} model ({params} parameters), {a.rollout_batch_size} prompts x "
        f"{a.n_samples_per_prompt} samples x {a.response_len} tokens per rollout, one optimizer step per rollout, "
        f"{num_rollout} rollouts (rate over steps 2..{num_rollout - 1}); {os.cpu_count()} cores"
        f"{' (avx512_bf16)' if bf16 else ''}, fp32"
    )
    base_rate = next((r["rollouts_per_min"] for r in results if r["mode"] == "colocated sync"), None)
    print(
        "| mode | rollouts/min | vs colocated sync | s/step waiting for rollout | rollout (generation) "
        "| train | weight sync | staleness (versions) | run wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['rollouts_per_min'] / base_rate:.2f}x" if base_rate else "-"
        print(
            f"| {r['mode']} | {r['rollouts_per_min']:.1f} | {ratio} | {r['wait']:.2f} | {r['rollout']:.2f} "
            f"| {r['train']:.2f} | {r['sync']:.3f} | {r['staleness']:.2f} | {r['wall_s']:.0f} |"
        )
    if not a.no_weight_sync:
        weight_sync_bench(a.quick)


if __name__ == "__main__":
    main()
