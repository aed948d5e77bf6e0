"""Benchmark: one training step of the default job's RL stage, in-process (no Ray, no engine), two
ways side by side:

* `--compare forward` (default): the old log-probs taken from the training forward (one forward,
  the default when a rollout makes one optimizer step) beside the separate no-grad pass forced on;
* `--compare dtype`: fp32 beside `--bf16` (mixed precision: bfloat16 matmuls under autocast, fp32
  weights and Adam), which pays off only on a CPU with bf16 units (AVX512-BF16 or AMX).

    .venv/bin/python bench/train_step.py [--compare forward|dtype] [--model tiny|25m] [--steps 20] [--threads 2]

The date and the CPU (model, bf16/AMX flags) are printed first. Same model (the default job's tiny
Qwen2, or the ~25M one of bench/lora.py: hidden 512, 8 layers), same batch (32 prompts x 8 samples of the bundled
addition task with the chat template, responses of 1-8 tokens with the engine's log-probs), same
options (the default job's RL stage: grpo, --global-batch-size 256, --micro-batch-size 256, lr 3e-4,
...). The two ways alternate step by step, each on its own actor; prints the median and mean
seconds per `TrainActor.train` call (wall clock, and this process's CPU time, which a busy machine
disturbs less), the speed-ups, and the largest metric difference between the two after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rollout_batch(model_dir: Path, data_dir: Path, prompts: int, samples: int, max_response: int, seed: int) -> dict:
    """The shape of a default-job rollout: real prompts (chat template), random response tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()[:prompts]]
    rng = random.Random(seed)
    data: dict = {"tokens": [], "response_lengths": [], "loss_masks": [], "rewards": [], "rollout_log_probs": []}
    for row in rows:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        rewards = [float(rng.random() < 0.4) for _ in range(samples)]
        mean = sum(rewards) / samples
        std = statistics.pstdev(rewards)
        for r in rewards:
            n = rng.randint(1, max_response)
            data["tokens"].append(ids + [rng.randrange(len(tok)) for _ in range(n)])
            data["response_lengths"].append(n)
            data["loss_masks"].append([1] * n)
            data["rewards"].append((r - mean) / (std + 1e-6))  # grpo: normalised on the rollout side
            data["rollout_log_probs"].append([-rng.uniform(0.5, 6) for _ in range(n)])
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed train() calls per way (after one warm-up each)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compare", choices=("forward", "dtype"), default="forward")
    p.add_argument("--model", choices=("tiny", "25m"), default="tiny")
    a = p.parse_args()

    from bench.hardware import header, matmul_gflops
    from bench.lora import MODELS
    from slime.arguments import parse_args, to_argv
    from slime.backends.torch.actor import TrainActor
    from slime.data.arithmetic import write_arithmetic_dataset
    from slime.data.tiny_model import build_tiny_model
    from slime.default_job import COMMON, RL, TASK, TINY_MODEL

    root = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    model_dir = build_tiny_model(root / "model", **(TINY_MODEL if a.model == "tiny" else MODELS[a.model]))
    write_arithmetic_dataset(root / "data", **TASK)
    rl = {k: v for k, v in RL.items() if k not in ("eval_interval", "save_interval", "stage")}
    common = {k: v for k, v in COMMON.items() if not k.startswith("eval_") and k != "n_samples_per_eval_prompt"}
    argv = (
        to_argv(common)
        + to_argv(rl)
        + ["--hf-checkpoint", str(model_dir), "--prompt-data", str(root / "data" / "train.jsonl")]
    )

    def actor(run: str, reuse: bool, *extra: str) -> TrainActor:
        args = parse_args(argv + ["--run-dir", str(root / f"run_{run}"), *extra])
        act = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=a.threads)
        act.init()
        act.reuse_training_forward = reuse
        return act

    if a.compare == "forward":
        ways = {"one forward (default)": actor("one", True), "separate old-log-prob pass": actor("sep", False)}
    else:
        ways = {"fp32 (default)": actor("fp32", True), "--bf16": actor("bf16", True, "--bf16")}
    batch = rollout_batch(
        model_dir,
        root / "data",
        RL["rollout_batch_size"],
        RL["n_samples_per_prompt"],
        COMMON["rollout_max_response_len"],
        seed=0,
    )
    times: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    last: dict[str, dict] = {}
    for step in range(a.steps + 1):
        for name, act in ways.items():
            data = {k: list(v) for k, v in batch.items()}
            t0, c0 = time.perf_counter(), time.process_time()
            last[name] = act.train(step, data)
            if step:  # the first call of each is a warm-up
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    (one, sep) = ways
    diff = max(abs(last[one][k] - last[sep][k]) for k in last[sep] if not k.startswith("perf/"))
    tokens = sum(len(t) for t in batch["tokens"])
    print(header())
    if a.compare == "dtype":  # the ceiling of --bf16's speed-up: what the matmuls alone gain
        import torch

        fp32, bf16 = (matmul_gflops(dtype, a.threads) for dtype in (torch.float32, torch.bfloat16))
        print(f"torch.mm, {a.threads} threads: fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x)")
    print(
        f"{a.model} model ({sum(p.numel() for p in ways[one].model.parameters()) / 1e6:.1f}M parameters), "
        f"default job's RL step: {len(batch['tokens'])} samples ({RL['rollout_batch_size']} prompts x "
        f"{RL['n_samples_per_prompt']}), {tokens} tokens, --global-batch-size {RL['global_batch_size']} "
        f"--micro-batch-size {RL['micro_batch_size']}, {a.threads} threads, {a.steps} steps each, alternating"
    )
    print(f"{'way':<30}{'median s/step':>15}{'mean s/step':>13}{'median CPU s/step':>19}")
    for name in ways:
        print(
            f"{name:<30}{statistics.median(times[name]):>15.4f}{statistics.mean(times[name]):>13.4f}"
            f"{statistics.median(cpu[name]):>19.4f}"
        )
    speedup = statistics.median(times[sep]) / statistics.median(times[one])
    cpu_speedup = statistics.median(cpu[sep]) / statistics.median(cpu[one])
    if a.compare == "dtype":  # the speed-up of the second way
        speedup, cpu_speedup = 1 / speedup, 1 / cpu_speedup
    print(
        f"speed-up of {'one forward' if a.compare == 'forward' else '--bf16'}: {speedup:.2f}x wall, {cpu_speedup:.2f}x CPU time (medians); largest metric "
        f"difference after {a.steps + 1} steps: {diff:.2e}"
    )


if __name__ == "__main__":
    main()
