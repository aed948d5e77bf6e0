"""`scripts/gpu_check.sh` without a GPU: `--dry-run` checks its arguments and prints the plan; a
real run on a machine without CUDA stops with a clear message; and (e2e) the whole flow of the
check runs on the CPU (`--device cpu`, a tiny shape), so everything but the CUDA-only calls has
run before a GPU machine is lent."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# Packages this project's venv has and the GPU machine's image does not (its package list is in the
# device notes), among those slime could import: unimportable, as they are there.
SITECUSTOMIZE = """
import importlib.abc, importlib.util, sys
_HIDDEN = {"ray", "wandb", "datasets", "openai", "anthropic", "sglang_router", "math_verify",
           "latex2sympy2_extended", "orjson", "jsonschema", "cryptography", "trio", "multiprocess", "selenium",
           "smart_open", "httptools", "setproctitle", "pylatexenc", "antlr4", "jiter", "websocket",
           "accelerate", "peft"}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU image)", name=name)
sys.meta_path.insert(0, _Hide())
_find_spec = importlib.util.find_spec
def _probe(name, package=None):  # a probe for an absent package answers None, as it would there
    return None if name.split(".")[0] in _HIDDEN else _find_spec(name, package)
importlib.util.find_spec = _probe
"""


def _run(*args: str, timeout: float = 120, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("OUT", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def _reference_params(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int) -> int:
    """The model the check builds, counted by transformers on the meta device."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def test_dry_run_prints_the_plan_without_a_gpu(tmp_path):
    out = _run("--dry-run", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for stage in (
        "(a) train: TrainActor on cuda without Ray",
        "(b) engine: slime.engine.server --device cuda",
        "256 sequences x 128 new tokens",
        "(c) sync:",
        "CUDA IPC handles",
        "(d) memory:",
        "time limit 480 s",
        "dry run: arguments checked, no GPU used",
    ):
        assert stage in text, stage
    n = int(re.search(r"context \d+: (\d+) parameters", text).group(1))
    assert n == _reference_params(896, 24, 14, 2, 4864, 320)  # Qwen2-0.5B's body, the tiny vocabulary
    assert re.search(r"modules: torch yes, .*fastapi (yes|MISSING)", text)
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_dry_run_plan_follows_the_arguments():
    out = _run(
        "--dry-run",
        "--hidden-size",
        "256",
        "--num-layers",
        "3",
        "--num-heads",
        "8",
        "--num-kv-heads",
        "4",
        "--intermediate-size",
        "512",
        "--concurrency",
        "64",
        "--new-tokens",
        "32",
    )
    assert out.returncode == 0, out.stderr
    n = int(re.search(r"context \d+: (\d+) parameters", out.stdout).group(1))
    assert n == _reference_params(256, 3, 8, 4, 512, 320)
    assert "64 sequences x 32 new tokens" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-heads", "5"], "--hidden-size 896 must be a multiple of --num-heads 5"),
        (["--num-kv-heads", "3"], "--num-heads 14 must be a multiple of --num-kv-heads 3"),
        (["--concurrency", "0"], "--concurrency must be >= 1, got 0"),
        (["--concurrency", "2048"], "one batch request holds at most 1024"),
        (["--train-steps", "1"], "--train-steps must be >= 2"),
        (["--train-batch", "30"], "--train-batch 30 must be a multiple of --micro-batch-size 8"),
        (["--parity-tol", "0"], "--parity-tol must be in (0, 1)"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static must be in (0, 1)"),
        (["--time-limit-s", "600"], "under 8 minutes"),
        (["--device", "tpu"], "--device 'tpu': cuda, cuda:N, or cpu"),
    ],
)
def test_bad_arguments_stop_before_anything_runs(args, message):
    out = _run("--dry-run", *args)
    assert out.returncode == 2
    assert out.stderr.startswith("gpu_check: error: ") and message in out.stderr
    assert "gpu_check plan" not in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_a_real_run_without_a_gpu_says_so(tmp_path):
    out = _run("--out", str(tmp_path))
    assert out.returncode == 2
    assert "gpu_check: error: --device cuda: no CUDA GPU visible to torch" in out.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(tmp_path):
    """Model built, trainer steps, engine server, HF generate, parity, IPC weight update (shared
    memory on the CPU), the table and the JSON: every stage the GPU run takes, with the packages
    the GPU machine's image lacks (Ray, wandb, datasets, ...) made unimportable in the check and
    in the engine it starts."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = _run(
        "--device",
        "cpu",
        "--hidden-size",
        "64",
        "--num-layers",
        "2",
        "--num-heads",
        "4",
        "--num-kv-heads",
        "2",
        "--intermediate-size",
        "128",
        "--concurrency",
        "8",
        "--prompt-len",
        "12",
        "--new-tokens",
        "12",
        "--train-batch",
        "8",
        "--micro-batch-size",
        "4",
        "--train-steps",
        "3",
        "--lr",
        "1e-2",
        # bf16 on a CPU: the engine may multiply fp32 copies of the weights where HF emulates
        # bf16 (slime.engine.native_forward.WideWeights), a few bf16 ulps apart
        "--parity-sequences",
        "4",
        "--parity-tol",
        "5e-3",
        "--out",
        str(tmp_path / "out"),
        timeout=600,
        pythonpath=str(hide),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ray MISSING" in out.stdout  # the hiding worked: the actor ran under the ray.remote stand-in
    tmp_path = tmp_path / "out"
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["facts"]["ray_stand_in"] is True
    checks = [r["check"] for r in report["rows"]]
    assert checks == [
        "(a) trainer on cpu",
        "(b) engine on cpu, tokens/s",
        "(b) engine log-probs vs HF forward (bf16)",
        "(c) shared-memory IPC weight update",
        "(d) peak GPU memory",
    ]
    assert all(r["ok"] for r in report["rows"])
    losses = report["facts"]["train_losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert report["facts"]["engine_tokens"] == 8 * 12 and report["facts"]["hf_tokens"] == 8 * 12
    table = (tmp_path / "gpu_check_table.md").read_text()
    assert table.count("| PASS |") == 5 and table in out.stdout
    assert (tmp_path / "engine.log").is_file()
