"""Fixtures for the built-in engine tests: real server processes and an HF reference of the tiny
model (`tiny_model_dir` comes from tests/conftest.py)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import warnings

import pytest
import torch

torch.set_num_threads(1)

from engine_test_utils import start_engine  # noqa: E402


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
    eng = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("engine_log"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def client(engine):
    from slime.engine.client import EngineClient

    with EngineClient(engine.url, timeout=60) as c:
        yield c
