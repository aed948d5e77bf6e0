"""Fixtures for the built-in engine tests: a tiny model, real server processes, an HF reference."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import warnings
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

from engine_test_utils import start_engine  # noqa: E402


def _build_fallback_model(out_dir: Path) -> Path:
    """A tiny Qwen2 with a byte-level tokenizer (no merges, so Qwen2Tokenizer round-trips it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    alphabet = sorted(ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>"]
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|end|>", pad_token="<|pad|>",
                                  padding_side="left")
    cfg = Qwen2Config(vocab_size=272, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=257, pad_token_id=256)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from slime.data.tiny_model import build_tiny_model
        except ImportError:
            return _build_fallback_model(out)
        return Path(build_tiny_model(out))


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
