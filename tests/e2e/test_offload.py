"""--offload-train / --offload-rollout in real runs (Ray actors, an engine server, the trainer; in the
session's shared Ray cluster). --colocate turns both on (slime's rule); a run with both turned off writes the same
metrics, bit for bit (timings aside), so the optimizer state came back exactly each step. The
memory each side releases is measured as RSS."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def _argv(tiny_model_dir, task_dir, run_dir, *extra) -> list[str]:
    return [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--custom-rm-path",
        "tests.e2e.hooks.digit_reward",
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--lr",
        "1e-3",
        "--colocate",
        "--deterministic-mode",
        "--seed",
        "3",
        "--save-interval",
        "2",
        "--run-dir",
        str(run_dir),
        "--save",
        str(run_dir / "ckpt"),
        *extra,
    ]


def _run(argv: list[str]) -> str:
    """One run in this process; what it printed."""
    from slime.arguments import parse_args
    from slime.train import train

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train(parse_args(argv))
    return out.getvalue()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _without_timings(row: dict) -> str:
    return json.dumps(
        {k: v for k, v in row.items() if not (k.startswith("perf/") or "time" in k.rsplit("/", 1)[-1])}, sort_keys=True
    )


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    on, off = tmp_path_factory.mktemp("offload"), tmp_path_factory.mktemp("no_offload")
    out_on = _run(_argv(tiny_model_dir, task_dir, on))
    _run(_argv(tiny_model_dir, task_dir, off, "--no-offload-train", "--no-offload-rollout"))
    return on, off, out_on


def test_offloading_both_sides_writes_the_same_metrics_as_not_offloading(runs):
    on, off, _ = runs
    rows_on, rows_off = _rows(on), _rows(off)
    assert [r["rollout_id"] for r in rows_on] == [1, 2, 3]
    assert [_without_timings(r) for r in rows_on] == [_without_timings(r) for r in rows_off]
    assert not any("perf/train_offload_bytes" in r for r in rows_off)
    assert json.loads((on / "args.json").read_text())["offload_train"] is True
    assert json.loads((off / "args.json").read_text())["offload_train"] is False


def test_the_offloaded_bytes_are_adams_two_moments_and_steps(runs, tiny_model_dir):
    """AdamW's state per parameter tensor: exp_avg and exp_avg_sq (fp32, its size each) and a
    float32 step: the reference is counted from the model itself. The file is gone after onload."""
    from transformers import AutoModelForCausalLM

    on, _, stdout = runs
    params = list(AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    expected = sum(2 * 4 * p.numel() + 4 for p in params)
    rows = _rows(on)
    for r in rows:
        assert r["perf/train_offload_bytes"] == expected
        assert r["perf/train_rss_after"] <= r["perf/train_rss_before"]
    assert all(r["perf/train_onload_bytes"] == expected for r in rows[1:])  # restored before steps 2 and 3
    # the last step's state was offloaded when the run ended: its unnamed file went with the process
    assert list((on / "offload").iterdir()) == []
    print(f"\ntrainer RSS around --offload-train (tiny model, {expected / 1e6:.2f} MB of optimizer state):")
    for r in rows:
        print(
            f"  step {r['rollout_id']}: {r['perf/train_rss_before'] / 2**20:.1f} MiB -> "
            f"{r['perf/train_rss_after'] / 2**20:.1f} MiB in {r['perf/train_offload_time'] * 1e3:.1f} ms"
        )
    assert "[slime] placement" in stdout and "trainer rank 0: node" in stdout and "engine 0: node" in stdout


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_engine_releases_its_kv_cache_on_offload_rollout(tiny_model_dir, tmp_path):
    """What RolloutManager.offload asks of each engine (/release_memory_occupation): generation
    waits, the prefix cache (its KV) is dropped; measured as the server's RSS."""
    from slime.engine.client import EngineClient
    from slime.ray.engine_process import EngineProcess

    eng = EngineProcess.start(
        tiny_model_dir, num_threads=1, extra_args=["--random-seed", "0"], log_path=tmp_path / "engine.log"
    )
    try:
        eng.wait_until_healthy(timeout=180)
        with EngineClient(eng.url, timeout=120) as c:
            prompts = [[1 + (i * 7 + j) % 200 for j in range(200)] for i in range(48)]
            c.generate({"input_ids": prompts, "sampling_params": {"max_new_tokens": 32, "temperature": 1.0}})
            before = _rss(eng.pid)
            c.release_memory_occupation()
            released = _rss(eng.pid)
            c.resume_memory_occupation()
            out = c.generate({"input_ids": prompts[:2], "sampling_params": {"max_new_tokens": 4}})
        assert len(out) == 2  # serves again after onload
        # reference: the cached prompts' KV, layers x (K, V) x kv_heads x head_dim x fp32 per token
        cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_bytes = 48 * 200 * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 4
        print(
            f"\nengine RSS around --offload-rollout (tiny model, 48 cached prompts of 200 tokens, "
            f"{kv_bytes / 2**20:.1f} MiB of KV): {before / 2**20:.1f} MiB -> {released / 2**20:.1f} MiB"
        )
        assert before - released > 0.5 * kv_bytes
    finally:
        eng.stop()
