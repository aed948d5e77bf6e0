"""Benchmark: where a training step's time goes, in-process and through Ray.

    .venv/bin/python bench/step_profile.py [--steps 20] [--against REV] [--ray-steps 30]

1. **In-process**: the default job's RL step (`TrainActor.train`, same model, batch and options as
   bench/train_step.py) under cProfile, split into the model's forward, the backward pass, the
   losses, the optimizer step, building micro-batches, preparing the rollout data (advantages,
   metrics) and the rest; then the median wall and CPU seconds per call without the profiler.
2. **`--against REV`**: the same in-process step of another revision of this repository (a
   temporary `git worktree`), run in a subprocess, alternating with this tree call by call
   (both get the same batch): the speed-up, measured side by side.
3. **Through Ray** (`--ray-steps N`, 0 skips): a real `slime train --colocate` run of N steps of the
   same job (engine and trainer taking turns on the cores), and the medians of its `perf/*`
   metrics: how much of a step is the rollout, the trainer's own work, moving the data and the
   calls, offloading, and the weight sync. The loop's overhead is what the parts do not explain.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]

# cProfile attribution: function (file suffix, name) -> part; the first match up the stack wins
PARTS = [
    ("backward", ("torch/_tensor.py", "backward")),
    ("optimizer step", ("torch/optim/optimizer.py", "wrapper")),
    ("model forward", ("slime/backends/torch/batching.py", "forward")),
    ("model forward", ("slime/backends/torch/batching.py", "_shared_prompt_logits")),
    ("losses", ("slime/backends/torch/loss.py", "policy_loss")),
    ("log-softmax / entropy", ("slime/algorithms/losses.py", "compute_log_probs")),
    ("log-softmax / entropy", ("slime/algorithms/losses.py", "compute_entropy")),
    ("micro-batches", ("slime/backends/torch/batching.py", "build_micro_batch")),
    ("rollout data, advantages, metrics", ("slime/backends/torch/rollout_batch.py", "prepare_rl_batch")),
    ("rollout data, advantages, metrics", ("slime/backends/torch/rollout_batch.py", "reused_forward_metrics")),
]


def _setup(root: Path, src: Path, extra: tuple[str, ...] = ()):
    """An actor of the default job's RL stage on the tiny model, and one rollout's batch."""
    sys.path.insert(0, str(src))
    sys.path.insert(0, str(src / "bench"))
    from train_step import rollout_batch

    from slime.arguments import parse_args, to_argv
    from slime.backends.torch.actor import TrainActor
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model
    from slime.default_job import COMMON, RL, TASK, TINY_MODEL

    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, **TINY_MODEL)
        write_arithmetic_dataset(root / "data", **TASK)
    rl = {k: v for k, v in RL.items() if k not in ("eval_interval", "save_interval", "stage")}
    common = {k: v for k, v in COMMON.items() if not k.startswith("eval_") and k != "n_samples_per_eval_prompt"}
    argv = (
        to_argv(common)
        + to_argv(rl)
        + [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(root / "data" / "train.jsonl"),
            "--run-dir",
            str(root / f"run-{os.getpid()}"),
            *extra,
        ]
    )
    actor = TrainActor(parse_args(argv), rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=2)
    actor.init()
    batch = rollout_batch(
        model_dir,
        root / "data",
        RL["rollout_batch_size"],
        RL["n_samples_per_prompt"],
        COMMON["rollout_max_response_len"],
        seed=0,
    )
    return actor, batch


def _one_call(actor, batch, step: int) -> tuple[float, float]:
    data = {k: list(v) for k, v in batch.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    actor.train(step, data)
    return time.perf_counter() - t0, time.process_time() - c0


def worker(root: Path, src: Path, calls: int) -> None:
    """`--worker`: one actor of the tree at `src`; times one train() call per line read on stdin."""
    actor, batch = _setup(root, src)
    for _ in range(3):
        _one_call(actor, batch, 0)
    import slime

    print("ready", slime.__file__, flush=True)
    for step in range(calls):
        sys.stdin.readline()
        print(json.dumps(_one_call(actor, batch, step)), flush=True)


def attribute(stats: pstats.Stats, calls: int) -> dict[str, float]:
    """Seconds per call of each part: the cumulative time of the outermost matching function."""
    parts: dict[str, float] = {}
    for (file, _, name), (_, _, _, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        for part, (suffix, fname) in PARTS:
            if file.endswith(suffix) and name == fname:
                parts[part] = parts.get(part, 0.0) + cum / calls
    # the model forward's time includes the log-softmax only when it is called inside it: it is not
    return parts


def in_process(root: Path, steps: int) -> None:
    import torch

    torch.set_num_threads(2)
    actor, batch = _setup(root, REPO)
    for _ in range(3):
        _one_call(actor, batch, 0)
    prof = cProfile.Profile()
    calls = max(5, steps // 2)
    t0 = time.perf_counter()
    prof.enable()
    for step in range(calls):
        actor.train(step, {k: list(v) for k, v in batch.items()})
    prof.disable()
    total = (time.perf_counter() - t0) / calls
    parts = attribute(pstats.Stats(prof), calls)
    timed = [_one_call(actor, batch, s) for s in range(steps)]
    tokens = sum(len(t) for t in batch["tokens"])
    print(
        f"in-process: TrainActor.train on the default job's RL batch ({len(batch['tokens'])} samples, {tokens} "
        f"tokens), 2 threads; cProfile over {calls} calls ({total:.3f} s per call with the profiler on)"
    )
    print("| part | s per call | share |")
    print("|---|---|---|")
    for part, sec in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"| {part} | {sec:.4f} | {sec / total:.0%} |")
    rest = total - sum(parts.values())
    print(f"| the rest (metrics, Python around the calls) | {rest:.4f} | {rest / total:.0%} |")
    wall = statistics.median(t for t, _ in timed)
    cpu = statistics.median(c for _, c in timed)
    print(f"without the profiler: median {wall:.4f} s wall, {cpu:.4f} s CPU per call ({steps} calls)")
    # padding-free packing (--use-dynamic-batch-size): one row, a block-diagonal causal mask
    packed, _ = _setup(root, REPO, ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"))
    _one_call(packed, batch, 0)
    pairs = [(_one_call(actor, batch, s)[0], _one_call(packed, batch, s)[0]) for s in range(max(3, steps // 4))]
    pad_s, pack_s = statistics.median(p for p, _ in pairs), statistics.median(q for _, q in pairs)
    print(
        f"padded (the default) vs packed (--use-dynamic-batch-size --max-tokens-per-gpu 4096), alternating: "
        f"{pad_s:.4f} vs {pack_s:.4f} s per call ({pack_s / pad_s:.1f}x)\n"
    )


def against(root: Path, rev: str, steps: int) -> None:
    """This tree and `rev`, each in its own process, alternating call by call."""
    tree = Path(tempfile.mkdtemp(prefix="step-profile-rev-"))
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True
    )
    procs = {}
    try:
        for name, src in (("this tree", REPO), (f"revision {rev}", tree)):
            env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(src)}
            procs[name] = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", str(root), str(src), str(steps)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=src,
            )
            while not (line := procs[name].stdout.readline()).startswith("ready"):
                if procs[name].poll() is not None:
                    raise SystemExit(f"[step_profile] the {name} worker failed")
            if not line.split()[1].startswith(str(src)):  # the package must come from that tree
                raise SystemExit(f"[step_profile] the {name} worker imported slime from {line.split()[1]}")
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
        for _ in range(steps):
            for name, p in procs.items():  # one at a time: the other waits on stdin
                p.stdin.write("go\n")
                p.stdin.flush()
                times[name].append(tuple(json.loads(p.stdout.readline())))
    finally:
        for p in procs.values():
            p.kill()
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
    print(f"side by side, alternating call by call ({steps} calls each):")
    print("| tree | median s wall | median s CPU |")
    print("|---|---|---|")
    med = {n: (statistics.median(t for t, _ in v), statistics.median(c for _, c in v)) for n, v in times.items()}
    for name, (w, c) in med.items():
        print(f"| {name} | {w:.4f} | {c:.4f} |")
    (new_w, new_c), (old_w, old_c) = med.values()
    print(f"speed-up of this tree: {old_w / new_w:.2f}x wall, {old_c / new_c:.2f}x CPU\n")


RAY_PARTS = [
    ("perf/rollout_wait_time", "rollout (the loop waiting for it)"),
    ("perf/train_time", "the trainer's own work (train_time)"),
    ("perf/train_wait_time", "the train call as the loop sees it (train_wait)"),
    ("perf/train_offload_time", "  of which: optimizer state offload"),
    ("perf/train_onload_time", "  of which: optimizer state onload"),
    ("perf/rollout_offload_time", "engine KV release and resume (offload-rollout)"),
    ("perf/sync_wait_time", "the weight sync as the loop sees it (sync_wait)"),
    ("perf/update_weights_time", "  of which: the trainer's update_weights"),
    ("perf/step_time", "the whole step"),
]


def _ray_run(root: Path, steps: int, name: str, offload: bool) -> dict[str, float]:
    """Medians of the perf/* metrics of a real colocated run (first step: warm-up; last: the checkpoint)."""
    sys.path.insert(0, str(REPO / "bench"))
    import vs_trl

    run = root / f"ray-run-{name}"
    shutil.rmtree(run, ignore_errors=True)
    command, extra = vs_trl.SLIME_MODES["slime-rl sync"]
    if offload:
        extra = [x for x in extra if x not in ("--no-offload-train", "--no-offload-rollout")]
    argv = vs_trl.slime_argv(root / "model", root / "data", steps, 1, run) + extra
    proc = subprocess.run([sys.executable, "-m", "slime", command, *argv], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[step_profile] the Ray run failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_time" in r][1:-1]
    med = {k: statistics.median([r[k] for r in rows if k in r]) for k, _ in RAY_PARTS if any(k in r for r in rows)}
    waits = ("perf/rollout_wait_time", "perf/train_wait_time", "perf/rollout_offload_time", "perf/sync_wait_time")
    med["loop"] = med["perf/step_time"] - sum(med.get(k, 0.0) for k in waits)
    med["moving"] = (
        med["perf/train_wait_time"]
        - med["perf/train_time"]
        - med.get("perf/train_offload_time", 0.0)
        - med.get("perf/train_onload_time", 0.0)
    )
    return med


def through_ray(root: Path, steps: int) -> None:
    """The same colocated job twice: as `--colocate` sets it up (slime's rule: both offloads on) and
    with `--no-offload-train --no-offload-rollout` (what bench/vs_trl.py runs)."""
    cols = {
        "--colocate (offload on)": _ray_run(root, steps, "offload", True),
        "--colocate --no-offload-*": _ray_run(root, steps, "no-offload", False),
    }
    print(
        f"through Ray: `slime train --colocate` on the same job, {steps} steps each, one after the other "
        f"(median of steps 2..{steps - 1})"
    )
    print("| part | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for key, label in [
        *RAY_PARTS,
        ("loop", "the loop itself (step - rollout, train, offload and sync waits)"),
        ("moving", "moving the rollout data to the trainer, and the Ray calls"),
    ]:
        if any(key in c for c in cols.values()):
            print(f"| {label} | " + " | ".join(f"{c[key]:.4f}" if key in c else "-" for c in cols.values()) + " |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        import torch

        torch.set_num_threads(2)
        worker(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed train() calls")
    p.add_argument("--against", default=None, help="a git revision to compare with, side by side")
    p.add_argument("--ray-steps", type=int, default=30, help="steps of the real run through Ray (0: skip)")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="step-profile-"))
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start\n")
    in_process(root, a.steps)
    if a.against:
        against(root, a.against, a.steps)
    if a.ray_steps:
        through_ray(root, a.ray_steps)


if __name__ == "__main__":
    main()
