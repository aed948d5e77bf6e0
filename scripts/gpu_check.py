#!/usr/bin/env python3
"""The GPU check, run by `scripts/gpu_check.sh` (one command, one summary table): what runs on a
CUDA GPU, checked in one go.

On a randomly initialised Qwen2-style model built on the spot (by default Qwen2-0.5B's body:
hidden 896, 24 layers, 14/2 heads, MLP 4864; the vocabulary is the tiny model's byte-level one):

  (a) train   -- a few optimizer steps of `TrainActor` on CUDA, used directly (no Ray), --bf16
                 autocast with fp32 master weights, SFT loss on one fixed batch: finite and falling;
  (b) engine  -- the built-in engine server on CUDA (bf16): tokens/s with log-probs for
                 --concurrency sequences in one batch request, against HF `generate` (sampling,
                 with its scores) on the same GPU; the engine's log-probs against an HF forward
                 of the same tokens (mean |diff| within --parity-tol);
  (c) sync    -- the trainer's new weights into the running engine by CUDA IPC handles
                 (`slime.sync.ipc`), after which the engine's log-probs equal an HF forward of
                 the trainer's weights (in the engine's dtype) within --parity-tol;
  (d) memory  -- peak GPU memory of the trainer, HF generate and the engine process;
  (e) bad input -- an engine asked for more KV cache than the card holds stops at start-up.

`--dry-run` needs no GPU: it checks the arguments, says which Python modules are there and which
must come as wheels, and prints the plan. Exit status: 0 all checks passed, 1 a check failed or
the time limit was reached, 2 bad arguments or a machine that cannot run the check.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# What the check imports. The engine server needs the web stack, which the GPU machine's image
# lacks: `scripts/gpu_check.sh --download-wheels` fetches it into .whl/ (carried with the repo).
NEEDED = ("torch", "transformers", "safetensors", "tokenizers", "httpx", "yaml", "numpy")
WHEELS = (
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "uvicorn",
    "opentelemetry",
)
OPTIONAL = ("ray",)  # the actor's class is used directly; a stand-in module is installed without it
MAX_BATCH_REQUEST = 1024  # the engine's --max-batch-request-size default


class CheckError(Exception):
    """Bad arguments or a machine that cannot run the check (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="check the arguments and print the plan (no GPU needed)")
    p.add_argument(
        "--device",
        default="cuda",
        help="cuda or cuda:N; cpu runs the same flow on the CPU (the script's own test, with a tiny "
        "shape: the CUDA-only parts -- IPC handles, GPU memory -- are then shared memory and n/a)",
    )
    p.add_argument("--hidden-size", type=int, default=896)
    p.add_argument("--num-layers", type=int, default=24)
    p.add_argument("--num-heads", type=int, default=14)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=4864)
    p.add_argument("--train-steps", type=int, default=4, help="optimizer steps of (a)")
    p.add_argument("--train-batch", type=int, default=32, help="samples in (a)'s fixed batch")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--concurrency", type=int, default=256, help="sequences generated at once in (b)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--parity-sequences", type=int, default=8, help="engine outputs compared with an HF forward")
    p.add_argument("--parity-tol", type=float, default=1e-3, help="mean |log-prob diff| allowed (bf16)")
    p.add_argument("--mem-fraction-static", type=float, default=0.3, help="the engine's share of the GPU")
    p.add_argument("--time-limit-s", type=int, default=480, help="stop and print what is done after this long")
    p.add_argument(
        "--out",
        default=os.environ.get("OUT") or str(REPO / "gpu_check_out"),
        help="where the table, the JSON and the engine's log go (default: $OUT, else ./gpu_check_out)",
    )
    return p


def check_args(a: argparse.Namespace) -> None:
    for name in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "intermediate_size",
        "train_steps",
        "train_batch",
        "micro_batch_size",
        "concurrency",
        "prompt_len",
        "new_tokens",
        "parity_sequences",
        "time_limit_s",
    ):
        if getattr(a, name) < 1:
            raise CheckError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.hidden_size % a.num_heads:
        raise CheckError(f"--hidden-size {a.hidden_size} must be a multiple of --num-heads {a.num_heads}")
    if a.num_heads % a.num_kv_heads:
        raise CheckError(f"--num-heads {a.num_heads} must be a multiple of --num-kv-heads {a.num_kv_heads}")
    if (a.hidden_size // a.num_heads) % 2:
        raise CheckError(f"head dim {a.hidden_size // a.num_heads} (--hidden-size / --num-heads) must be even (RoPE)")
    if a.train_steps < 2:
        raise CheckError("--train-steps must be >= 2 (the loss must be seen falling)")
    if a.train_batch % a.micro_batch_size:
        raise CheckError(f"--train-batch {a.train_batch} must be a multiple of --micro-batch-size {a.micro_batch_size}")
    if a.concurrency > MAX_BATCH_REQUEST:
        raise CheckError(f"--concurrency {a.concurrency}: one batch request holds at most {MAX_BATCH_REQUEST}")
    if a.parity_sequences > a.concurrency:
        raise CheckError(f"--parity-sequences {a.parity_sequences} must be <= --concurrency {a.concurrency}")
    if not 0 < a.parity_tol < 1:
        raise CheckError(f"--parity-tol must be in (0, 1), got {a.parity_tol}")
    if not 0 < a.mem_fraction_static < 1:
        raise CheckError(f"--mem-fraction-static must be in (0, 1), got {a.mem_fraction_static}")
    if a.device != "cpu" and not (a.device == "cuda" or (a.device.startswith("cuda:") and a.device[5:].isdigit())):
        raise CheckError(f"--device {a.device!r}: cuda, cuda:N, or cpu (the script's own test)")
    if a.time_limit_s > 480:
        raise CheckError(f"--time-limit-s {a.time_limit_s}: the check must finish in under 8 minutes (<= 480)")


def param_count(a: argparse.Namespace, vocab: int) -> int:
    """Parameters of the Qwen2 model built (tied embeddings, q/k/v biases)."""
    h, d = a.hidden_size, a.hidden_size // a.num_heads
    kv = a.num_kv_heads * d
    attn = h * h + h + 2 * (h * kv + kv) + h * h
    mlp = 3 * h * a.intermediate_size
    return vocab * h + a.num_layers * (attn + mlp + 2 * h) + h


def context_length(a: argparse.Namespace) -> int:
    return -(-(a.prompt_len + a.new_tokens + 1) // 64) * 64


def modules() -> dict[str, bool]:
    def present(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return {m: present(m) for m in (*NEEDED, *WHEELS, *OPTIONAL)}


def plan(a: argparse.Namespace) -> list[str]:
    vocab = 320  # slime.data.tiny_model's default tokenizer size
    n = param_count(a, vocab)
    gib = 1024**3
    train_mem = n * (4 + 4 + 8) / gib  # fp32 weights + grads + AdamW moments
    return [
        f"model: Qwen2-style, hidden {a.hidden_size}, {a.num_layers} layers, {a.num_heads}/{a.num_kv_heads} heads, "
        f"MLP {a.intermediate_size}, vocab {vocab}, context {context_length(a)}: {n} parameters ({n / 1e6:.1f}M), "
        "random init, built on the spot",
        f"(a) train: TrainActor on {a.device} without Ray, --bf16 autocast + fp32 master weights, SFT loss, "
        f"{a.train_steps} steps on one fixed batch of {a.train_batch} x ({a.prompt_len}+{a.new_tokens}) tokens, "
        f"micro-batch {a.micro_batch_size}, lr {a.lr}; weights+grads+Adam ~{train_mem:.1f} GiB",
        f"(b) engine: slime.engine.server --device {a.device} --dtype bfloat16 --mem-fraction-static {a.mem_fraction_static}; "
        f"{a.concurrency} sequences x {a.new_tokens} new tokens (ignore_eos) with log-probs in one batch request, "
        f"vs HF generate (sampling, scores) on the same GPU; log-probs of {a.parity_sequences} outputs vs an HF "
        f"bf16 forward: mean |diff| <= {a.parity_tol}",
        f"(c) sync: the trainer's weights -> the engine by CUDA IPC handles (update_weights_from_tensor, "
        f"load_format torch_ipc); then engine log-probs vs an HF bf16 forward of those weights <= {a.parity_tol}",
        "(d) memory: peak GPU memory of the trainer (torch), HF generate (torch) and the engine process (nvidia-smi)",
        "(e) bad input: an engine asked for more KV cache than the GPU holds stops at start-up naming "
        "--max-total-tokens and the card's memory (cuda only)",
        f"time limit {a.time_limit_s} s; output: {a.out}/gpu_check.json, {a.out}/gpu_check_table.md, {a.out}/engine.log",
    ]


# ------------------------------------------------------------------------------ the run
class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def install_ray_stand_in() -> bool:
    """`slime.backends.torch.actor` wraps its class with `ray.remote` at import; without Ray
    (the GPU machine has none) that wrapper is the identity. Returns whether it was needed."""
    try:
        import ray

        return False
    except ImportError:
        pass
    ray = types.ModuleType("ray")

    def remote(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda cls: cls)

    ray.remote = remote
    sys.modules["ray"] = ray
    return True


def engine_memory_mib(pid: int) -> float | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return None


def run(a: argparse.Namespace, rows: list[dict], facts: dict) -> None:
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor
    from slime.data.tiny_model import build_tiny_model
    from slime.ray.engine_process import EngineProcess
    from slime.sync.ipc import push_weights_ipc
    from slime.sync.tensor import engine_sequence_log_probs

    gib = 1024**3
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        dev = torch.device("cuda", dev.index or 0)
        props = torch.cuda.get_device_properties(dev)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / gib, 1))
    else:
        facts.update(gpu="cpu (--device cpu: the script's own test)", gpu_memory_gib=0)
    facts.update(torch=torch.__version__, cuda=torch.version.cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    t = time.perf_counter()
    model_dir = build_tiny_model(
        work / "model",
        hidden_size=a.hidden_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        intermediate_size=a.intermediate_size,
        max_position_embeddings=context_length(a),
    )
    cfg = json.loads((model_dir / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    facts.update(model_build_s=round(time.perf_counter() - t, 1), vocab=vocab, params=param_count(a, vocab))

    # ---------------------------------------------------------------- (a) the trainer on CUDA
    t = time.perf_counter()
    targs = parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--rollout-batch-size",
            str(a.train_batch),
            "--n-samples-per-prompt",
            "1",
            "--num-rollout",
            str(a.train_steps),
            "--micro-batch-size",
            str(a.micro_batch_size),
            "--lr",
            str(a.lr),
            "--lr-decay-style",
            "constant",
            "--loss-type",
            "sft_loss",
            "--bf16",
            "--run-dir",
            str(work / "run"),
        ]
    )
    actor = TrainActor(
        targs, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=4, device=str(dev)
    )
    actor.init()
    g = torch.Generator().manual_seed(0)
    length = a.prompt_len + a.new_tokens
    tokens = torch.randint(10, vocab, (a.train_batch, length), generator=g).tolist()
    batch = {
        "tokens": tokens,
        "response_lengths": [a.new_tokens] * a.train_batch,
        "loss_masks": [[1] * a.new_tokens] * a.train_batch,
        "rewards": [0.0] * a.train_batch,
    }
    losses, step_s, peak = [], [], 0.0
    for step in range(a.train_steps):
        s = time.perf_counter()
        m = actor.train(step, {k: list(v) for k, v in batch.items()})
        sync()
        step_s.append(time.perf_counter() - s)
        losses.append(m["train/loss"])
        peak = max(peak, m.get("perf/train_peak_memory_gb", 0.0))
    ok = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    on_gpu = actor.device == dev and next(actor.model.parameters()).device == dev
    rows.append(
        dict(
            check=f"(a) trainer on {dev.type}",
            ok=ok and on_gpu,
            value=f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {a.train_steps} steps, "
            f"{sum(step_s[1:]) / max(1, len(step_s) - 1):.2f} s/step after the first",
            peak_gib=round(peak, 2),
        )
    )
    facts.update(train_losses=losses, train_step_s=step_s, train_setup_s=round(time.perf_counter() - t, 1))

    # ---------------------------------------------------------------- (b) the engine on CUDA vs HF
    eng = EngineProcess.start(
        model_dir,
        num_threads=4,
        log_path=Path(a.out) / "engine.log",
        extra_args=[
            "--device",
            str(dev),
            "--dtype",
            "bfloat16",
            "--random-seed",
            "0",
            "--max-running-requests",
            str(a.concurrency),
            "--mem-fraction-static",
            str(a.mem_fraction_static),
            "--context-length",
            str(context_length(a)),
        ],
    )
    try:
        eng.wait_until_healthy(timeout=180)
        prompts = torch.randint(10, vocab, (a.concurrency, a.prompt_len), generator=g).tolist()
        sp = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": a.new_tokens, "ignore_eos": True}
        with httpx.Client(timeout=600, trust_env=False) as c:
            warm = c.post(
                eng.url + "/generate",
                json={"input_ids": prompts[:8], "return_logprob": True, "sampling_params": {**sp, "max_new_tokens": 8}},
            )
            warm.raise_for_status()
            s = time.perf_counter()
            r = c.post(
                eng.url + "/generate", json={"input_ids": prompts, "return_logprob": True, "sampling_params": sp}
            )
            r.raise_for_status()
            engine_s = time.perf_counter() - s
        outs = r.json()
        engine_tokens = sum(int(o["meta_info"]["completion_tokens"]) for o in outs)
        engine_tps = engine_tokens / engine_s
        engine_mib = engine_memory_mib(eng.pid)

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(dev).eval()
        ids = torch.tensor(prompts, device=dev)
        gen_kw = dict(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=a.new_tokens,
            min_new_tokens=a.new_tokens,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=cfg.get("pad_token_id") or 0,
        )
        with torch.no_grad():
            hf.generate(
                ids[:8], attention_mask=torch.ones_like(ids[:8]), **{**gen_kw, "max_new_tokens": 8, "min_new_tokens": 8}
            )
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            s = time.perf_counter()
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), **gen_kw)
            scores = torch.stack(gen.scores, 1).float().log_softmax(-1)
            new = gen.sequences[:, a.prompt_len :]
            hf_lp = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # the log-probs, as the engine returns them
            sync()
            hf_s = time.perf_counter() - s
        hf_tokens = int(new.numel())
        hf_tps = hf_tokens / hf_s
        hf_peak = torch.cuda.max_memory_allocated(dev) / gib if cuda else 0.0
        del gen, scores, hf_lp

        def hf_log_probs(model, seq: list[int], start: int) -> torch.Tensor:
            with torch.no_grad():
                logits = model(torch.tensor([seq], device=dev)).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            pos = torch.arange(start - 1, len(seq) - 1, device=dev)
            return lp[pos, torch.tensor(seq[start:], device=dev)].cpu()

        diffs = []
        # only the first --parity-sequences outputs are checked, each against its prompt
        for o, p in zip(outs[: a.parity_sequences], prompts, strict=False):
            out_ids = list(o["output_ids"])
            mine = torch.tensor([float(x[0]) for x in o["meta_info"]["output_token_logprobs"]])
            diffs.append((mine - hf_log_probs(hf, p + out_ids, len(p))).abs())
        d = torch.cat(diffs)
        rows.append(
            dict(
                check=f"(b) engine on {dev.type}, tokens/s",
                ok=engine_tokens == a.concurrency * a.new_tokens,
                value=f"{engine_tps:,.0f} tok/s with log-probs ({a.concurrency} seqs x {a.new_tokens}) vs "
                f"HF generate {hf_tps:,.0f} tok/s: x{engine_tps / hf_tps:.2f}",
                peak_gib=None if engine_mib is None else round(engine_mib / 1024, 2),
            )
        )
        rows.append(
            dict(
                check="(b) engine log-probs vs HF forward (bf16)",
                ok=float(d.mean()) <= a.parity_tol,
                value=f"mean abs diff {float(d.mean()):.2e}, max {float(d.max()):.2e} over {d.numel()} tokens",
                peak_gib=round(hf_peak, 2),
            )
        )
        facts.update(engine_s=engine_s, engine_tokens=engine_tokens, hf_s=hf_s, hf_tokens=hf_tokens)

        # ------------------------------------------------------------ (c) CUDA-IPC weight update
        seq = prompts[0][:32] + list(outs[0]["output_ids"])[:32]
        state = actor.full_state_dict()
        hf.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
        want = hf_log_probs(hf, seq, 1)
        before = (torch.tensor(engine_sequence_log_probs(eng.url, seq)) - want).abs().mean()
        s = time.perf_counter()
        push_weights_ipc([eng.url], state, weight_version="gpu-check")
        sync_s = time.perf_counter() - s
        after = (torch.tensor(engine_sequence_log_probs(eng.url, seq)) - want).abs()
        trainer_fp32 = actor.check_weight_parity(eng.url, seq)
        rows.append(
            dict(
                check=f"(c) {'CUDA-IPC' if cuda else 'shared-memory IPC'} weight update",
                ok=float(after.mean()) <= a.parity_tol < float(before),
                value=f"{sync_s:.2f} s; engine vs trainer's weights (bf16 forward): mean abs diff "
                f"{float(before):.2e} before -> {float(after.mean()):.2e} after (max "
                f"{float(after.max()):.2e}); vs the fp32 trainer {trainer_fp32:.2e}",
                peak_gib=None,
            )
        )
        facts.update(sync_s=sync_s)
        mib = engine_memory_mib(eng.pid)
        rows.append(
            dict(
                check="(d) peak GPU memory",
                ok=True,
                value=f"trainer {peak:.2f} GiB, HF generate {hf_peak:.2f} GiB, engine process "
                + ("n/a (nvidia-smi)" if mib is None else f"{mib / 1024:.2f} GiB"),
                peak_gib=None,
            )
        )
    finally:
        eng.stop()
    if cuda:  # (e) bad input: a KV budget larger than the card stops the server at start-up, naming it
        from slime.ray.engine_process import child_env

        too_many = str(10**10)
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "slime.engine.server",
                "--model-path",
                str(model_dir),
                "--device",
                str(dev),
                "--dtype",
                "bfloat16",
                "--max-total-tokens",
                too_many,
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env=child_env(),
        )
        said = [line for line in bad.stderr.splitlines() if "GiB of GPU memory" in line]
        rows.append(
            dict(
                check="(e) more KV than the GPU has",
                ok=bad.returncode != 0 and bool(said),
                value=(said[-1][:200] if said else f"exit {bad.returncode}: {bad.stderr[-200:]}"),
                peak_gib=None,
            )
        )


def table(rows: list[dict], facts: dict) -> str:
    head = (
        f"GPU check ({facts.get('date', '')}): {facts.get('gpu', '?')}, {facts.get('gpu_memory_gib', '?')} GiB, "
        f"torch {facts.get('torch', '?')} (CUDA {facts.get('cuda', '?')}); model {facts.get('params', 0) / 1e6:.0f}M "
        f"params; {facts.get('total_s', 0):.0f} s"
    )
    lines = [head, "", "| check | result | value | peak GPU GiB |", "|---|---|---|---|"]
    for r in rows:
        peak = "" if r.get("peak_gib") is None else f"{r['peak_gib']}"
        lines.append(f"| {r['check']} | {'PASS' if r['ok'] else 'FAIL'} | {r['value']} | {peak} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        check_args(a)
    except CheckError as e:
        print(f"gpu_check: error: {e}", file=sys.stderr)
        return 2
    print("gpu_check plan:")
    for line in plan(a):
        print("  " + line)
    have = modules()
    missing = [m for m in (*NEEDED, *WHEELS) if not have[m]]
    print("modules: " + ", ".join(f"{m} {'yes' if ok else 'MISSING'}" for m, ok in have.items()))
    if a.dry_run:
        if missing:
            print(
                f"  (a real run needs {', '.join(missing)}: `bash scripts/gpu_check.sh --download-wheels` "
                "puts the web stack's wheels in .whl/, which the device run installs)"
            )
        print("dry run: arguments checked, no GPU used")
        return 0
    import torch

    if a.device != "cpu" and not torch.cuda.is_available():
        print(
            f"gpu_check: error: --device {a.device}: no CUDA GPU visible to torch {torch.__version__} (run with "
            "--dry-run for the plan only)",
            file=sys.stderr,
        )
        return 2
    if missing:
        print(
            f"gpu_check: error: missing Python modules {', '.join(missing)} (carry .whl/ from "
            "`bash scripts/gpu_check.sh --download-wheels`)",
            file=sys.stderr,
        )
        return 2
    facts = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ray_stand_in": install_ray_stand_in()}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(a.time_limit_s)
    status = 0
    try:
        run(a, rows, facts)
    except Timeout:
        rows.append(dict(check="time limit", ok=False, value=f"stopped after {a.time_limit_s} s", peak_gib=None))
    except Exception as e:  # noqa: BLE001 - the table says which stage broke, the traceback why
        import traceback

        traceback.print_exc()
        rows.append(dict(check="error", ok=False, value=f"{type(e).__name__}: {e}"[:300], peak_gib=None))
    finally:
        signal.alarm(0)
    facts["total_s"] = time.perf_counter() - t0
    text = table(rows, facts)
    print("\n" + text)
    (Path(a.out) / "gpu_check_table.md").write_text(text + "\n")
    (Path(a.out) / "gpu_check.json").write_text(json.dumps({"rows": rows, "facts": facts}, indent=2, default=str))
    if not rows or not all(r["ok"] for r in rows):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
