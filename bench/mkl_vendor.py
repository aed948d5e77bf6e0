"""Benchmark: what the MKL vendor shim (slime/runtime/mkl_vendor.py) changes, side by side.

    .venv/bin/python bench/mkl_vendor.py [--rounds 3] [--threads 1]

torch's CPU matrix products run in Intel MKL, which takes a generic path on CPUs not made by Intel.
slime-rl preloads a one-function shim into its trainer and engine processes where that applies
(see the module). This script runs the same work in fresh subprocesses with and without the shim,
alternating round by round (`--rounds`), and prints the medians and the ratio:

* fp32 matrix products of the ~25M model's shapes (hidden 512, MLP 1536): a training-size product
  (2048 tokens) and a decode-step product (64 rows);
* the ~25M model's training step, in-process: forward (one forward per prompt), backward and AdamW
  on 8 prompts x 8 samples x 32 response tokens (the batch of `bench/vs_trl.py --model 25m`);
* the built-in engine's decode: 64 rows x 32 new tokens through the native forward (tokens/s).

Where the shim does not apply (an Intel CPU, another architecture) it says why and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# One subprocess: every measurement once (after a warm-up), printed as JSON.
WORKER = r"""
import json, sys, time, statistics
sys.path.insert(0, __REPO__); sys.path.insert(0, __REPO__ + "/bench")
import torch
import torch.nn.functional as F
from pathlib import Path
torch.set_num_threads(__THREADS__)
from slime.runtime.mkl_vendor import loaded
out = {"shim": loaded()}

def gflops(m, k, n, reps):
    a, w = torch.randn(m, k), torch.randn(n, k)
    for _ in range(3):
        F.linear(a, w)
    t = time.perf_counter()
    for _ in range(reps):
        F.linear(a, w)
    return 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9

out["mm 2048x512x1536 GFLOP/s"] = gflops(2048, 512, 1536, 40)
out["mm 64x512x1536 GFLOP/s"] = gflops(64, 512, 1536, 800)

from transformers import AutoModelForCausalLM, AutoTokenizer
from shared_prompt import MODELS, batch
from slime.backends.torch.batching import build_micro_batch
model = AutoModelForCausalLM.from_pretrained(__MODEL__, dtype=torch.float32).train()
tok = AutoTokenizer.from_pretrained(__MODEL__)
data = batch(tok, 8, 8, 32)
mb = build_micro_batch(data, range(len(data["tokens"])), packed=False, share_prompts=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
steps = []
for i in range(4):
    t = time.perf_counter()
    model.zero_grad(set_to_none=True)
    mb.response_logits(model).float().logsumexp(-1).mean().backward()
    opt.step()
    if i:
        steps.append(time.perf_counter() - t)
out["train step (s)"] = statistics.median(steps)

from slime.engine.native_forward import NativeForward
model.eval()
nf = NativeForward(model, torch.float32, context_length=256)
prompt = data["tokens"][0][: len(data["tokens"][0]) - data["response_lengths"][0]]
def decode():
    b = nf.new_batch()
    logits, _, _ = nf.add_rows(b, [prompt] * 64, 32, False, {}, True)
    for _ in range(32):
        logits = nf.decode(b, logits.argmax(-1))
decode()
t = time.perf_counter()
decode()
out["engine decode (tok/s)"] = 64 * 32 / (time.perf_counter() - t)
print("RESULT " + json.dumps(out))
"""


def run_worker(model: Path, threads: int, shim: bool) -> dict:
    from slime.runtime.mkl_vendor import preload_env

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)})
    if shim:
        env.update(preload_env())
    code = (
        WORKER.replace("__REPO__", repr(str(REPO)))
        .replace("__THREADS__", str(threads))
        .replace("__MODEL__", repr(str(model)))
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    if result.pop("shim") != shim:
        raise SystemExit(f"the worker {'lacks' if shim else 'has'} the shim")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="subprocesses of each way, alternating")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    a = p.parse_args()

    from slime.data.tiny_model import build_tiny_model
    from slime.runtime.mkl_vendor import cpu_info, not_applicable

    sys.path.insert(0, str(REPO / "bench"))
    from shared_prompt import MODELS

    why = not_applicable()
    info = cpu_info()
    print(
        f"CPU vendor {info.get('vendor_id', '?')}, avx512f {'avx512f' in info.get('flags', '').split()}, "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start"
    )
    if why is not None:
        print(f"the MKL vendor shim does not apply here: {why}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m25", **MODELS["~25M"]["shape"])
        results: dict[bool, list[dict]] = {True: [], False: []}
        for r in range(a.rounds):
            for shim in (False, True) if r % 2 == 0 else (True, False):
                results[shim].append(run_worker(model, a.threads, shim))
                print(f"[mkl_vendor] round {r}, shim {'on' if shim else 'off'}: done", flush=True)
    print(f"\nMKL vendor shim, {a.threads} thread(s), median of {a.rounds} subprocess(es) each way")
    print("| measurement | without the shim | with the shim | ratio |")
    print("|---|---|---|---|")
    for key in results[True][0]:
        off = statistics.median(r[key] for r in results[False])
        on = statistics.median(r[key] for r in results[True])
        better = off / on if key.endswith("(s)") else on / off  # > 1: faster with the shim
        print(f"| {key} | {off:.3f} | {on:.3f} | {better:.2f}x |")
    print("ratio > 1: faster with the shim")


if __name__ == "__main__":
    main()
