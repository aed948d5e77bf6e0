"""Fixtures for the agent-adapter tests: a real engine server (with an API key the agents never
see), adapters served from their own threads, the tiny model loaded directly for reference
log-probs (`tiny_model_dir`, `tokenizer` and `hf_model` come from tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

ENGINE_KEY = "engine-key-the-agent-never-sees"


def start_engine(model_dir, log_dir):
    """The engine tests' server, with the key only the adapter holds."""
    from tests.engine.engine_test_utils import start_engine as start_engine_server

    return start_engine_server(model_dir, "--api-key", ENGINE_KEY, log_dir=log_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    eng = start_engine(tiny_model_dir, tmp_path_factory.mktemp("agent_engine"))
    yield eng
    eng.stop()


def serve(adapter):
    from slime.agent.aiohttp_threaded import run_app_in_thread

    return run_app_in_thread(adapter.app)


@pytest.fixture(scope="module")
def openai_adapter(engine, tokenizer):
    from slime.agent.adapters import OpenAIAdapter

    adapter = OpenAIAdapter(tokenizer=tokenizer, sglang_url=engine.url, engine_api_key=ENGINE_KEY, max_turns_per_sid=4)
    handle = serve(adapter)
    adapter.base_url = handle.url + "/v1"
    yield adapter
    handle.stop()


@pytest.fixture(scope="module")
def anthropic_adapter(engine, tokenizer):
    from slime.agent.adapters import AnthropicAdapter

    adapter = AnthropicAdapter(
        tokenizer=tokenizer, sglang_url=engine.url, engine_api_key=ENGINE_KEY, max_turns_per_sid=4
    )
    handle = serve(adapter)
    adapter.base_url = handle.url
    yield adapter
    handle.stop()


@torch.no_grad()
def reference_logprobs(model, tokens: list[int], positions: list[int]) -> list[float]:
    """log_softmax of the logits at position p - 1 for token p, from one forward over `tokens`."""
    logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[p - 1, tokens[p]].item() for p in positions]
