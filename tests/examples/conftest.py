"""Fixtures of the example tests: one real engine server per module, a fresh GenerateState."""

import pytest


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from slime.ray.engine_process import EngineProcess

    eng = EngineProcess.start(tiny_model_dir, num_threads=1, extra_args=["--random-seed", "0", "--weight-version", "0"])
    try:
        eng.wait_until_healthy(timeout=120)
        yield eng
    finally:
        eng.stop()


@pytest.fixture
def fresh_generate_state():
    """GenerateState is a per-process singleton: a test that uses it gets its own (own tokenizer/args)."""
    from slime.rollout.sglang_rollout import GenerateState

    GenerateState.reset()
    yield
    GenerateState.reset()
