"""--offload-rollout at the engine: the memory it releases, measured as RSS. The runs with and
without offload (--colocate turns both sides on, slime's rule), which write the same metrics bit for
bit, and the trainer's offloaded bytes are in tests/e2e/test_reproducibility.py (they share its runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


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
