"""Benchmark: weight-sync time per transport, each beside a raw torch.distributed broadcast of the
same bytes measured in the same run.

    .venv/bin/python bench/weight_sync.py [--quick] [--models tiny,25m] [--repeats 5] [--threads N]

For each model (the tiny default, 0.12M parameters, and a ~25M Qwen2-style model: hidden 512,
8 layers, intermediate 1536, 8/2 heads, random init, as bench/rollout.py builds them), one real
engine server (`python -m slime.engine.server`) and, in this process, the trainer side, each with
`--threads` torch threads (default: all cores, what each side gets colocated, taking turns):

* raw broadcast: a gloo `broadcast` of one flat buffer of the weights' bytes (tied weights once)
  from this process to a second process (the floor a collective sync cannot beat), taken right
  before each full sync measured, so each ratio compares syncs with the floor measured beside them;
* full, shared memory (`--update-weight-transport nccl --colocate`, the default colocated on CPU):
  the trainer writes into the /dev/shm buffer, the engine copies from its mapping;
* full, collective (`--update-weight-transport nccl`, not colocated): SGLang's
  /update_weights_from_distributed over gloo, one bucket (--update-weight-buffer-size default);
* full, disk (`--update-weight-transport disk`): an HF checkpoint per sync, engine reloads it;
* delta, disk (`--update-weight-mode delta`): after one AdamW step at lr 1e-6 (weight decay 0.01,
  the trainer's defaults), changed bytes xor-encoded + zstd, checksummed, patched into the engine's
  local checkpoint and reloaded; its bytes against the full disk sync's, on the float32 checkpoint
  and on a bfloat16 copy of it (the engine then serves bfloat16, as real checkpoints are);
* the earlier HTTP path (safetensors bytes posted to /update_weights_from_tensor) for reference;
* the engine-side load alone (`ModelRunner.load_named_tensors`, in this process), with
  the C transposing copy and with torch's `copy_` (SLIME_DISABLE_KERNELS).

Each is the median of `--repeats` syncs after one warm-up. Every sync ends with the engine
serving the new weights (it answers after its load).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slime.data.tiny_model import build_tiny_model  # noqa: E402
from slime.ray.engine_process import EngineProcess  # noqa: E402
from slime.sync.disk import DiskWeightSync  # noqa: E402
from slime.sync.distributed import DistributedWeightSync  # noqa: E402
from slime.sync.shm import SharedMemoryWeightSync  # noqa: E402
from slime.sync.tensor import dedupe_tied, push_weights  # noqa: E402
from slime.utils.net import free_port  # noqa: E402

MODELS = {
    "tiny": {},
    "25m": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1536,
        max_position_embeddings=1024,
    ),
}

RECEIVER = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(1)
    from slime.engine.weight_group import create_gloo_group
    port, nbytes = int(sys.argv[1]), int(sys.argv[2])
    g = create_gloo_group("127.0.0.1", port, 1, 2, "bench", 600)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    flag = torch.zeros(1, dtype=torch.int64)
    while True:  # the sender says 1 (a broadcast follows) or 0 (done)
        g.broadcast(flag)
        if not int(flag):
            break
        g.broadcast(buf)
    g.shutdown()
""")


def _median(fn, repeats: int) -> float:
    fn()  # warm-up (buffers, groups, page faults, kernel build)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class RawBroadcast:
    """A gloo group with a second process; `once()` broadcasts `nbytes` to it and returns the seconds."""

    def __init__(self, nbytes: int):
        from slime.engine.weight_group import create_gloo_group

        port = free_port("127.0.0.1")
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.child = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), str(nbytes)], env=env)
        self.group = create_gloo_group("127.0.0.1", port, 0, 2, "bench", 600)
        self.buf = torch.ones(nbytes, dtype=torch.uint8)

    def once(self) -> float:
        self.group.broadcast(torch.ones(1, dtype=torch.int64))
        t0 = time.perf_counter()
        self.group.broadcast(self.buf)
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            self.group.broadcast(torch.zeros(1, dtype=torch.int64))
            self.child.wait(timeout=60)
        finally:
            if self.child.poll() is None:
                self.child.kill()
            self.group.shutdown()


def _paired(raw: RawBroadcast, fn, repeats: int) -> tuple[float, float]:
    """(median of fn, median of the raw broadcasts taken right before each): under a load that
    drifts, each sync is compared with the floor measured next to it."""
    fn()
    raw.once()
    a, b = [], []
    for _ in range(repeats):
        b.append(raw.once())
        t0 = time.perf_counter()
        fn()
        a.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def _bf16_copy(model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    m.save_pretrained(out)
    for f in model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "generation_config.json"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _trained(model_dir: Path, lr: float = 1e-6):
    """(model before, state after one AdamW step at `lr`)."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    after = copy.deepcopy(m).train()
    opt = torch.optim.AdamW(after.parameters(), lr=lr, weight_decay=0.01)
    ids = torch.randint(10, 300, (8, 64), generator=torch.Generator().manual_seed(0))
    after(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return m, {k: v.detach() for k, v in after.state_dict().items()}


def load_only(model_dir: Path, state: dict, repeats: int) -> tuple[float, float]:
    """The engine's load (ModelRunner.load_named_tensors) alone: (C transposing copy, torch copy_)."""
    from slime.engine import weight_copy
    from slime.engine.model_runner import ModelRunner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = ModelRunner(str(model_dir))
    named = dict(dedupe_tied(state))
    lib = weight_copy._load()
    fast, slow = [], []
    try:
        for i in range(2 * repeats + 2):  # interleaved (the first pair is a warm-up)
            weight_copy._lib = lib if i % 2 == 0 else None  # None: torch's copy_
            t0 = time.perf_counter()
            runner.load_named_tensors(named)
            if i >= 2:
                (fast if i % 2 == 0 else slow).append(time.perf_counter() - t0)
    finally:
        weight_copy._lib = lib
    return statistics.median(fast), statistics.median(slow)


def measure(name: str, tmp: Path, repeats: int, quick: bool, threads: int) -> dict:
    torch.set_num_threads(threads)
    model_dir = Path(build_tiny_model(tmp / name, **MODELS[name]))
    base, state = _trained(model_dir)
    tensors = dedupe_tied(state)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    r: dict = {"model": name, "params": sum(p.numel() for p in base.parameters()), "bytes": nbytes}
    raw = RawBroadcast(nbytes)
    root = tmp / f"{name}-sync"
    try:
        with EngineProcess.start(
            str(model_dir), num_threads=threads, extra_args=["--weight-load-dirs", str(root)]
        ) as eng:
            eng.wait_until_healthy(timeout=300)
            urls = [eng.url]
            shm = SharedMemoryWeightSync()
            r["shm"], r["raw_shm"] = _paired(raw, lambda: shm.push(urls, state, weight_version="shm"), repeats)
            shm.close()
            coll = DistributedWeightSync()
            r["collective"], r["raw_coll"] = _paired(
                raw, lambda: coll.push(urls, state, weight_version="nccl"), repeats
            )
            coll.close()
            full = DiskWeightSync(disk_dir=str(root / "full"), mode="full", base_checkpoint=str(model_dir))
            r["disk"], r["raw_disk"] = _paired(raw, lambda: full.push(urls, state, weight_version="disk"), repeats)
            r["raw"] = statistics.median([r["raw_shm"], r["raw_coll"], r["raw_disk"]])
            r["disk_bytes"] = full.last["perf/weight_sync_bytes"]
            r["http"] = _median(lambda: push_weights(urls, state, weight_version="http"), 1 if quick else repeats)
            r["delta_time"], r["delta_bytes"] = _delta(model_dir, base, state, root / "delta", urls)
    finally:
        raw.close()
    r["load_c"], r["load_torch"] = load_only(model_dir, state, repeats)
    bf16 = _bf16_copy(model_dir, tmp / f"{name}-bf16")
    with EngineProcess.start(str(bf16), num_threads=threads, extra_args=["--weight-load-dirs", str(root)]) as eng:
        eng.wait_until_healthy(timeout=300)
        full = DiskWeightSync(disk_dir=str(root / "full-bf16"), mode="full", base_checkpoint=str(bf16))
        full.push([eng.url], state, weight_version="disk")
        r["bf16_disk_bytes"] = full.last["perf/weight_sync_bytes"]
        r["bf16_delta_time"], r["bf16_delta_bytes"] = _delta(bf16, base, state, root / "delta-bf16", [eng.url])
    return r


def _delta(model_dir: Path, base, state: dict, root: Path, urls: list[str]) -> tuple[float, float]:
    """One delta sync of `state` (one small step from `base`), the engine starting from `model_dir`."""
    sync = DiskWeightSync(
        disk_dir=str(root / "pub"), mode="delta", local_dir=str(root / "local"), base_checkpoint=str(model_dir)
    )
    sync.push(urls, base.state_dict(), weight_version="base")  # nothing changed: the chain starts
    t0 = time.perf_counter()
    m = sync.push(urls, state, weight_version="delta")
    return time.perf_counter() - t0, m["perf/weight_sync_bytes"]


def _cpu() -> str:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown CPU"
    return "avx512_bf16" if "avx512_bf16" in flags else "no avx512_bf16"


def report(results: list[dict], repeats: int, threads: int) -> None:
    print(
        f"\nweight sync, trainer and engine on one machine ({os.cpu_count()} cores, {_cpu()}), {threads} torch "
        f"thread(s) each (colocated, they take turns on the cores), "
        f"median of {repeats} syncs, each right after a raw broadcast (the x columns: sync / the raw broadcasts "
        "taken beside it); every sync ends with the engine serving the new weights"
    )
    print(
        "| model | bytes | raw gloo broadcast | full: shared memory | full: collective (gloo) | full: disk | "
        "delta: disk | earlier HTTP payload | shm / raw | collective / raw |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} ({r['params'] / 1e6:.2f}M) | {r['bytes'] / 1e6:.1f} MB | {1e3 * r['raw']:.1f} ms | "
            f"{1e3 * r['shm']:.1f} ms | {1e3 * r['collective']:.1f} ms | {1e3 * r['disk']:.1f} ms | "
            f"{1e3 * r['delta_time']:.1f} ms | {1e3 * r['http']:.1f} ms | {r['shm'] / r['raw_shm']:.2f}x | "
            f"{r['collective'] / r['raw_coll']:.2f}x |"
        )
    print("\ndelta after one AdamW step (lr 1e-6, weight decay 0.01): bytes written vs a full disk sync")
    print("| model | checkpoint dtype | full disk sync | delta | delta / full |")
    print("|---|---|---|---|---|")
    for r in results:
        for dt, full, delta in (
            ("float32", r["disk_bytes"], r["delta_bytes"]),
            ("bfloat16", r["bf16_disk_bytes"], r["bf16_delta_bytes"]),
        ):
            print(f"| {r['model']} | {dt} | {full / 1e6:.2f} MB | {delta / 1e6:.2f} MB | {100 * delta / full:.1f}% |")
    print(
        f"\nengine-side load alone (ModelRunner.load_named_tensors, {threads} thread(s), interleaved): "
        "column-major linears need a "
        "transposing copy"
    )
    print("| model | C transposing copy | torch copy_ |")
    print("|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {1e3 * r['load_c']:.1f} ms | {1e3 * r['load_torch']:.1f} ms |")


def run(
    quick: bool = False, models: str = "tiny,25m", repeats: int | None = None, threads: int | None = None
) -> list[dict]:
    repeats = repeats or (3 if quick else 5)
    threads = threads or os.cpu_count() or 1
    results = []
    with tempfile.TemporaryDirectory(prefix="slime-wsync-") as tmp:
        for name in models.split(","):
            print(f"  weight sync: {name} ...", file=sys.stderr, flush=True)
            results.append(measure(name, Path(tmp), repeats, quick, threads))
    report(results, repeats, threads)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--models", default="tiny,25m")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of trainer and engine (default: all cores, as colocated)",
    )
    a = p.parse_args()
    run(quick=a.quick, models=a.models, repeats=a.repeats, threads=a.threads)


if __name__ == "__main__":
    main()
