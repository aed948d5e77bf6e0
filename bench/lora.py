"""Benchmark: full fine-tuning vs LoRA: the trainer in-process (no Ray), then weight sync into a real engine.

    .venv/bin/python bench/lora.py [--models 25m,150m,190m] [--steps 3] [--lora-rank 16] [--threads 2] [--recompute] [--bf16] [--no-sync]

For each model (Qwen2-style, random init, the default job's tokenizer: ~25M parameters = hidden 512,
8 layers; ~150M = hidden 1024, 12 layers, about 6x; ~190M = hidden 1536, 7 layers, about 7.5x) and each way of training (every weight, or a
LoRA adapter of rank R on every linear layer of the decoder), one subprocess builds the real
`TrainActor` (GRPO, the default job's RL options) and trains the same synthetic batch (16 samples:
prompts of 24-40 tokens, responses of 8-16). Printed per row: the median wall seconds of a
`TrainActor.train` call (one optimizer step) after one warm-up call, the subprocess's peak
resident memory over the whole process (loading the model included) and while training only
(VmHWM reset after the actor is built: weights, gradients, optimizer state, activations, the
libraries), the bytes of trainer state that scale with the model (parameters, their gradients
and the optimizer's tensors).

Then, per model, the weight sync against a real engine server (`python -m slime.engine.server`,
colocated: shared memory, and the collective transport over loopback gloo, `--threads` threads) of
a LoRA policy whose B is non-zero: bytes and
median seconds of a full sync of every weight (what full fine-tuning sends), of the merge on the
trainer plus that sync (what a LoRA run sends where adapters cannot go), of the first adapter sync (the base goes along) and of
an adapter-only sync (the engine merges it); the engine's rollout tokens/s after each (greedy, 16
prompts x 64 new tokens: the engine serves a plain model either way); and what serving the adapter
unmerged would cost per decode step instead (every adapted linear layer's x·W^T against
x·W^T + s·(x·A^T)·B^T, torch, batch 1 and 16), the measurement behind merging in the engine.

The CPU model and its bf16/AMX flags are printed first: figures are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hardware import cpu_line  # noqa: E402

MODELS = {
    "25m": dict(
        hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536
    ),
    "150m": dict(
        hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, intermediate_size=3072
    ),
    # ~7.5x the 25M model, wider rather than deeper: an adapter's share of a layer's weights is
    # r (d_in + d_out) / (d_in d_out), so at a given rank it shrinks as the layers widen
    "190m": dict(
        hidden_size=1536, num_hidden_layers=7, num_attention_heads=24, num_key_value_heads=4, intermediate_size=4608
    ),
}
SAMPLES = 16


def batch(seed: int = 0) -> dict:
    import random

    rng = random.Random(seed)
    tokens, resp, masks, rewards, lps = [], [], [], [], []
    for i in range(SAMPLES):
        p, r = rng.randint(24, 40), rng.randint(8, 16)
        tokens.append([rng.randint(8, 300) for _ in range(p + r)])
        resp.append(r)
        masks.append([1] * r)
        rewards.append(float(i % 2))
        lps.append([-rng.uniform(3, 7) for _ in range(r)])
    return {
        "tokens": tokens,
        "response_lengths": resp,
        "loss_masks": masks,
        "rewards": rewards,
        "rollout_log_probs": lps,
    }


def worker(
    model_dir: str, lora_rank: int, steps: int, threads: int, run_dir: str, recompute: bool = False, bf16: bool = False
) -> dict:
    """One TrainActor (full or LoRA) training the batch `steps` + 1 times; what it measured."""
    import torch

    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor

    argv = [
        "--hf-checkpoint",
        model_dir,
        "--rollout-batch-size",
        str(SAMPLES // 8),
        "--n-samples-per-prompt",
        "8",
        "--global-batch-size",
        str(SAMPLES),
        "--micro-batch-size",
        "8",
        "--advantage-estimator",
        "grpo",
        "--lr",
        "1e-4",
        "--adam-beta2",
        "0.999",
        "--clip-grad",
        "1.0",
        "--num-rollout",
        str(steps + 1),
        "--run-dir",
        run_dir,
    ]
    if recompute:  # gradient checkpointing of every decoder layer
        argv += ["--recompute-granularity", "full"]
    if bf16:  # autocast bf16 (fp32 master weights; a LoRA run keeps its frozen base in bf16)
        argv += ["--bf16"]
    if lora_rank:
        argv += ["--enable-lora", "--lora-rank", str(lora_rank), "--lora-alpha", str(2 * lora_rank)]
    actor = TrainActor(
        parse_args(argv), rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=threads
    )
    actor.init()
    rss_after_init = _status_kb("VmRSS") / 1024
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on: training only
    times = []
    for step in range(steps + 1):
        data = {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in batch(step).items()}
        t0 = time.perf_counter()
        actor.train(step, data)
        times.append(time.perf_counter() - t0)

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    params = list(actor.model.parameters())
    optim = [v for s in actor.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {
        "step_s": statistics.median(times[1:]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "train_peak_mb": _status_kb("VmHWM") / 1024,
        "init_rss_mb": rss_after_init,
        # gradients are dropped after each step (zero_grad(set_to_none)): counted at the size they take
        "state_mb": (nbytes(params) + nbytes([p for p in params if p.requires_grad]) + nbytes(optim)) / 2**20,
        "params_m": sum(p.numel() for p in params) / 1e6,
        "trainable_m": sum(p.numel() for p in params if p.requires_grad) / 1e6,
    }


def sync_rows(model_dir: Path, rank: int, repeats: int, threads: int) -> dict:
    """Full (merged) vs adapter-only sync into a real engine, its rollout tokens/s, and the unmerged cost."""
    from argparse import Namespace

    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.torch import lora
    from slime.engine.client import EngineClient
    from slime.ray.engine_process import EngineProcess
    from slime.sync.distributed import DistributedWeightSync
    from slime.sync.shm import SharedMemoryWeightSync

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opts = dict(lora_rank=rank, lora_alpha=2 * rank, lora_dropout=0.0, lora_target_modules=["all-linear"])
    lora.apply(
        model, Namespace(**opts, lora_exclude_modules=[], lora_adapter_path=None, seed=0, bf16=False, fp16=False)
    )
    with torch.no_grad():  # a trained adapter: B != 0
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.01)
    raw = {k: v.detach() for k, v in model.state_dict().items()}
    merged = lora.merged(raw, lora.scaling(model))
    field = {"scaling": lora.scaling(model), "base_id": "bench", "modules": lora.adapted_modules(model)}
    adapter = lora.engine_adapter(raw)
    with_base = {**lora.base_view(raw), **adapter}
    out: dict = {}
    with EngineProcess.start(str(model_dir), num_threads=threads) as eng:
        eng.wait_until_healthy(timeout=600)
        shm, client = SharedMemoryWeightSync(), EngineClient(eng.url)

        def timed(fn) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        def tokens_per_s() -> float:
            prompts = [[(7 * i + j) % 300 + 8 for j in range(24)] for i in range(16)]
            body = {
                "input_ids": prompts,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True},
            }
            t0 = time.perf_counter()
            res = client.generate(body)
            return sum(r["meta_info"]["completion_tokens"] for r in res) / (time.perf_counter() - t0)

        try:
            full = [timed(lambda: shm.push([eng.url], merged, weight_version="full")) for _ in range(repeats + 1)]
            out["full_s"], out["full_mb"] = statistics.median(full[1:]), shm._size / 2**20
            out["full_tok_s"] = tokens_per_s()
            merging = [
                timed(lambda: shm.push([eng.url], lora.merged(raw, field["scaling"]), weight_version="merged"))
                for _ in range(repeats + 1)
            ]
            out["merged_s"] = statistics.median(merging[1:])
            out["base_s"] = timed(
                lambda: shm.push([eng.url], with_base, weight_version="base", lora={**field, "base": True})
            )
            out["base_mb"] = shm._size / 2**20
            adapter_times = [
                timed(lambda: shm.push([eng.url], adapter, weight_version="lora", lora={**field, "base": False}))
                for _ in range(repeats + 1)
            ]
            out["adapter_s"], out["adapter_mb"] = statistics.median(adapter_times[1:]), shm._size / 2**20
            out["lora_tok_s"] = tokens_per_s()
            shm.close()
            group = DistributedWeightSync()  # the collective transport (engines not colocated), gloo on loopback
            full = [timed(lambda: group.push([eng.url], merged, weight_version="c-full")) for _ in range(repeats + 1)]
            group.push([eng.url], with_base, weight_version="c-base", lora={**field, "base": True})
            adapter_times = [
                timed(lambda: group.push([eng.url], adapter, weight_version="c-lora", lora={**field, "base": False}))
                for _ in range(repeats + 1)
            ]
            out["coll_full_s"], out["coll_adapter_s"] = (
                statistics.median(full[1:]),
                statistics.median(adapter_times[1:]),
            )
            group.close()
        finally:
            shm.close()
    out["unmerged"] = {b: unmerged_cost(raw, lora.scaling(model), b, repeats) for b in (1, 16)}
    return out


def unmerged_cost(raw: dict, scale: float, batch_size: int, repeats: int) -> float:
    """Time of every adapted layer's x·W^T + s·(x·A^T)·B^T over that of x·W^T alone, at one decode step."""
    import torch

    layers = [
        (raw[k], raw[k.replace(".base_layer.", ".lora_A.default.")], raw[k.replace(".base_layer.", ".lora_B.default.")])
        for k in raw
        if k.endswith(".base_layer.weight")
    ]
    xs = [torch.randn(batch_size, w.shape[1]) for w, _, _ in layers]

    def plain() -> None:
        for x, (w, _, _) in zip(xs, layers, strict=True):
            x @ w.T

    def with_adapter() -> None:
        for x, (w, a, b) in zip(xs, layers, strict=True):
            x @ w.T + scale * ((x @ a.T) @ b.T)

    times: dict = {plain: [], with_adapter: []}
    with torch.inference_mode():
        for _ in range(repeats + 1):
            for fn in times:
                t0 = time.perf_counter()
                for _ in range(5):
                    fn()
                times[fn].append(time.perf_counter() - t0)
    return statistics.median(times[with_adapter][1:]) / statistics.median(times[plain][1:])


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="25m,150m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sync-repeats", type=int, default=5, help="syncs timed per kind (after one warm-up)")
    ap.add_argument("--recompute", action="store_true", help="train with --recompute-granularity full (both ways)")
    ap.add_argument("--bf16", action="store_true", help="train with --bf16 (both ways)")
    ap.add_argument("--no-sync", action="store_true", help="the trainer table only (no engine)")
    ap.add_argument("--worker", nargs=4, metavar=("MODEL_DIR", "RANK", "STEPS", "RUN_DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        model_dir, rank, steps, run_dir = a.worker
        print(json.dumps(worker(model_dir, int(rank), int(steps), a.threads, run_dir, a.recompute, a.bf16)))
        return

    from slime.data.tiny_model import build_tiny_model

    print(
        f"{time.strftime('%Y-%m-%d')}; {cpu_line()}; torch threads {a.threads}; fp32 master weights"
        f"{'; --bf16 (autocast; the LoRA base kept in bf16)' if a.bf16 else ''}"
        f"{'; activation recomputation (--recompute-granularity full)' if a.recompute else ''}"
    )
    print(
        f"batch: {SAMPLES} samples (prompts 24-40 tokens, responses 8-16), one optimizer step per call; LoRA rank {a.lora_rank}, alpha {2 * a.lora_rank}, all linear layers of the decoder"
    )
    print(
        "| model | training | parameters (M) | trained (M) | s per step | peak RSS, whole / training (MB) | params+grads+Adam (MB) |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        rows: dict[tuple[str, str], dict] = {}
        for name in a.models.split(","):
            model_dir = Path(tmp) / name
            build_tiny_model(model_dir, **MODELS[name])
            for way, rank in (("full", 0), ("LoRA", a.lora_rank)):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--threads",
                        str(a.threads),
                        *(["--recompute"] if a.recompute else []),
                        *(["--bf16"] if a.bf16 else []),
                        "--worker",
                        str(model_dir),
                        str(rank),
                        str(a.steps),
                        f"{tmp}/run-{name}-{way}",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    raise SystemExit(f"{name} {way} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows[(name, way)] = r
                print(
                    f"| {name} | {way} | {r['params_m']:.1f} | {r['trainable_m']:.2f} | {r['step_s']:.2f} | {r['peak_rss_mb']:.0f} / {r['train_peak_mb']:.0f} "
                    f"| {r['state_mb']:.0f} |",
                    flush=True,
                )
        print()
        for name in a.models.split(","):
            full, lo = rows[(name, "full")], rows[(name, "LoRA")]
            print(
                f"{name}: LoRA / full: step time {lo['step_s'] / full['step_s']:.2f}x, peak RSS {lo['peak_rss_mb'] / full['peak_rss_mb']:.0%} "
                f"(training {lo['train_peak_mb'] / full['train_peak_mb']:.0%}), "
                f"params+grads+Adam {lo['state_mb'] / full['state_mb']:.0%}"
            )
        if a.no_sync:
            return
        print()
        print(
            "weight sync into a real engine (shared memory, colocated), median of "
            f"{a.sync_repeats}; rollout tokens/s after it (16 prompts x 64 new tokens, greedy):"
        )
        print("| model | sync | MB moved | s per sync | rollout tokens/s after |")
        print("|---|---|---|---|---|")
        for name in a.models.split(","):
            r = sync_rows(Path(tmp) / name, a.lora_rank, a.sync_repeats, a.threads)
            print(
                f"| {name} | full fine-tuning: every weight | {r['full_mb']:.1f} | {r['full_s']:.3f} | {r['full_tok_s']:.0f} |"
            )
            print(
                f"| {name} | LoRA, merged on the trainer, every weight | {r['full_mb']:.1f} | {r['merged_s']:.3f} | - |"
            )
            print(f"| {name} | LoRA, first (base + adapter) | {r['base_mb']:.1f} | {r['base_s']:.3f} | - |")
            print(
                f"| {name} | LoRA, adapter only | {r['adapter_mb']:.2f} | {r['adapter_s']:.3f} | {r['lora_tok_s']:.0f} |"
            )
            print(
                f"| {name} | collective (gloo, loopback): every weight | {r['full_mb']:.1f} | {r['coll_full_s']:.3f} | - |"
            )
            print(f"| {name} | collective: LoRA adapter only | {r['adapter_mb']:.2f} | {r['coll_adapter_s']:.3f} | - |")
            print(
                f"{name}: adapter-only sync moves {r['adapter_mb'] / r['full_mb']:.2%} of a full sync's bytes in "
                f"{r['adapter_s'] / r['full_s']:.2f}x its time ({r['adapter_s'] / r['merged_s']:.2f}x a merged LoRA sync's); serving the adapter unmerged would make the adapted "
                f"layers' matmuls {r['unmerged'][1]:.2f}x (batch 1) / {r['unmerged'][16]:.2f}x (batch 16) as slow",
                flush=True,
            )


if __name__ == "__main__":
    main()
