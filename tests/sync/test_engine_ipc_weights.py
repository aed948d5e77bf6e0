"""Colocated weight sync by IPC handles into a real engine server (`slime.sync.ipc`), on the CPU
with shared-memory tensors (the codec's own tests: tests/sync/test_tensor_ipc.py)."""

from __future__ import annotations

import pytest
import torch

# an engine server process
pytestmark = pytest.mark.e2e


def test_engine_takes_ipc_weights_and_its_log_probs_follow(tiny_model_dir, tmp_path):
    """A real engine server maps the trainer's tensors (`load_format: torch_ipc`), and its log-probs
    then equal an HF forward of the new weights, computed here."""
    from transformers import AutoModelForCausalLM

    from slime.engine.client import EngineClient
    from slime.ray.engine_process import EngineProcess
    from slime.sync.ipc import push_weights_ipc
    from slime.sync.tensor import engine_sequence_log_probs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    seq = [5, 6, 7, 8, 9, 10, 11, 12]
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    want = torch.log_softmax(logits, -1)[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]
    eng = EngineProcess.start(
        tiny_model_dir,
        num_threads=1,
        extra_args=["--dtype", "float32", "--device", "cpu"],
        log_path=tmp_path / "engine.log",
    )
    try:
        eng.wait_until_healthy(timeout=120)
        before = torch.tensor(engine_sequence_log_probs(eng.url, seq))
        assert (before - want).abs().max() > 1e-3  # the engine still serves the old weights
        push_weights_ipc([eng.url], model.state_dict(), weight_version="ipc-1")
        got = torch.tensor(engine_sequence_log_probs(eng.url, seq))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        with EngineClient(eng.url, timeout=30) as c:
            assert c.get_weight_version() == "ipc-1"
    finally:
        eng.stop()
