"""Benchmark: the megatron backend's training step beside the fsdp backend's, same model, same batch.

    .venv/bin/python bench/megatron_step.py [--models tiny,25m] [--steps 5] [--rounds 2] [--threads 2]

For each model (the default job's tiny Qwen2, and the ~25M one of bench/lora.py) and each layout
(fsdp on 1 rank and on 2 data-parallel ranks; megatron at TP 1, TP 2 and DP 2), the training ranks
run as processes over gloo, as in a run, on one rollout of the default job's RL shape (32 prompts x
8 samples of the addition task, responses of 1-8 tokens), one optimizer step per `train` call
(--global-batch-size 256, --micro-batch-size 32, grpo). The machine's threads are shared out: one
rank gets all of them, two ranks half each. Every layout runs --steps timed calls after one warm-up,
in rounds whose order alternates (forward, then backward), so a slow spell of the machine falls on
all of them; the median seconds per step is printed with the ratio to fsdp on 1 rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hardware import header  # noqa: E402
from bench.lora import MODELS  # noqa: E402
from bench.train_step import rollout_batch  # noqa: E402

# name: (backend, ranks, tensor-parallel)
LAYOUTS = {
    "fsdp 1 rank": ("fsdp", 1, 1),
    "fsdp DP2": ("fsdp", 2, 1),
    "megatron TP1": ("megatron", 1, 1),
    "megatron TP2": ("megatron", 2, 2),
    "megatron DP2": ("megatron", 2, 1),
}


def _rank(rank: int, world: int, port: int, argv: list[str], threads: int, steps: int, batch: dict, out: str) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    from slime.arguments import parse_args
    from slime.backends.megatron_utils.actor import MegatronTrainActor
    from slime.backends.torch.actor import TrainActor

    args = parse_args(argv)
    cls = MegatronTrainActor if args.train_backend == "megatron" else TrainActor
    actor = cls(args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port, num_threads=threads)
    actor.init()
    times = []
    for step in range(steps + 1):
        data = {k: list(v) for k, v in batch.items()}
        t0 = time.perf_counter()
        actor.train(step, data)
        if step:  # the first call is a warm-up
            times.append(time.perf_counter() - t0)
    if rank == 0:
        torch.save(times, out)


def run_layout(argv: list[str], world: int, threads: int, steps: int, batch: dict, out: Path) -> list[float]:
    import torch

    from slime.utils.net import free_port
    from tests.helpers import run_ranks

    run_ranks(_rank, world, free_port(), argv, max(1, threads // world), steps, batch, str(out), timeout=1800)
    return torch.load(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,25m")
    p.add_argument("--steps", type=int, default=5, help="timed train() calls per layout and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads of the machine shared out among the ranks")
    a = p.parse_args()

    from slime.arguments import to_argv
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model
    from slime.default_job import COMMON, RL, TASK, TINY_MODEL

    root = Path(tempfile.mkdtemp(prefix="bench-megatron-"))
    write_arithmetic_dataset(root / "data", **TASK)
    shapes = {"tiny": TINY_MODEL, **MODELS}
    print(header())
    print(
        f"one rollout of {RL['rollout_batch_size']} prompts x {RL['n_samples_per_prompt']} samples, one optimizer step "
        f"per call (--global-batch-size 256 --micro-batch-size 32), fp32, {a.threads} threads shared out, "
        f"{a.steps} timed steps x {a.rounds} rounds per layout"
    )
    for name in a.models.split(","):
        model_dir = build_tiny_model(root / name, **shapes[name])
        batch = rollout_batch(model_dir, root / "data", RL["rollout_batch_size"], RL["n_samples_per_prompt"], 8, seed=0)
        argv = to_argv(
            {k: v for k, v in COMMON.items() if not k.startswith("eval_") and k != "n_samples_per_eval_prompt"}
        )
        argv += ["--hf-checkpoint", str(model_dir), "--prompt-data", str(root / "data" / "train.jsonl")]
        argv += [
            "--rollout-batch-size",
            str(RL["rollout_batch_size"]),
            "--n-samples-per-prompt",
            str(RL["n_samples_per_prompt"]),
        ]
        argv += ["--global-batch-size", "256", "--micro-batch-size", "32", "--lr", "3e-4", "--num-rollout", "100"]
        times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        for r in range(a.rounds):
            order = list(LAYOUTS) if r % 2 == 0 else list(reversed(LAYOUTS))
            for layout in order:
                backend, world, tp = LAYOUTS[layout]
                run_argv = argv + ["--train-backend", backend, "--actor-num-gpus-per-node", str(world)]
                run_argv += ["--tensor-model-parallel-size", str(tp), "--run-dir", str(root / f"run_{name}_{layout}")]
                times[layout] += run_layout(run_argv, world, a.threads, a.steps, batch, root / "times.pt")
        base = statistics.median(times["fsdp 1 rank"])
        print(f"\nmodel {name} ({sum(len(t) for t in batch['tokens'])} tokens per step)")
        print(f"{'layout':<16}{'median s/step':>15}{'vs fsdp 1 rank':>16}")
        for layout, ts in times.items():
            m = statistics.median(ts)
            print(f"{layout:<16}{m:>15.3f}{m / base:>15.2f}x")


if __name__ == "__main__":
    main()
