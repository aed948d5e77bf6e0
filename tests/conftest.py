"""Shared fixtures: one tiny model and one task data set per test session (built offline); the
built-in engine server the engine, rollout, sync and ray tests talk to, and the tiny model loaded
directly with transformers for reference values."""

import os

# The test process computes references while an engine server (its own process) runs beside it:
# one thread each, never oversubscribed cores (set before torch is imported)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import warnings

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from slime.data.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory):
    from slime.data.arithmetic import write_arithmetic_dataset

    out = tmp_path_factory.mktemp("task")
    write_arithmetic_dataset(out, difficulty=2, num_eval=32, seed=0)
    return out


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    """The same checkpoint loaded directly with transformers (fp32), for reference values."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """A built-in engine server (a real process) for the module's tests."""
    from tests.engine.engine_test_utils import start_engine

    eng = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("engine_log"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def client(engine):
    from slime.engine.client import EngineClient

    with EngineClient(engine.url, timeout=60) as c:
        yield c
