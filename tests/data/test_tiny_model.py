import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from slime.data import tiny_model
from slime.data.tiny_model import build_tiny_model, build_tokenizer
from slime.errors import SlimeError

torch.set_num_threads(1)


def _shared_model(tmp_path_factory, arch):
    """One build per test session and arch (other test files reuse the same directory)."""
    d = tmp_path_factory.getbasetemp() / f"tiny-{arch}"
    if not (d / "config.json").exists():
        build_tiny_model(d, arch=arch)
    return d


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request, tmp_path_factory):
    return request.param, _shared_model(tmp_path_factory, request.param)


TEXTS = [
    "57+8=",
    "".join(chr(c) for c in range(32, 127)),
    "Hello,  World!\n\tline two\r\n  \\boxed{1,000}. x=y_2; ~`'\"",
    "<|user|>12+3=<|end|><|assistant|>\\boxed{15}<|end|>",
    "   leading and trailing spaces   ",
]


def test_round_trip_ids_identical_to_trained_tokenizer(model_dir):
    from transformers import AutoTokenizer

    arch, d = model_dir
    trained = build_tokenizer(seed=0, model_max_length=256)
    loaded = AutoTokenizer.from_pretrained(str(d))
    assert len(loaded) == len(trained)
    assert loaded.get_vocab() == trained.get_vocab()
    for text in TEXTS:
        ids = trained.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, (arch, text)
        assert trained.backend_tokenizer.encode(text, add_special_tokens=False).ids == ids
        assert loaded.decode(ids) == text
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == type(loaded).__name__


def test_special_tokens_digits_and_template(model_dir):
    from transformers import AutoTokenizer

    _, d = model_dir
    tok = AutoTokenizer.from_pretrained(str(d))
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<|pad|>"
    assert tok.bos_token is None
    for t in ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|pad|>"):
        assert tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(t)) == t
        assert tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)]
    # every digit is its own token, whatever surrounds it
    ids = tok.encode("x 1234567890 98765+43210=", add_special_tokens=False)
    digit_ids = {tok.convert_tokens_to_ids(str(i)) for i in range(10)}
    pieces = [tok.decode([i]) for i in ids]
    assert all(
        not any(c.isdigit() for c in p) or (len(p) == 1 and i in digit_ids) for p, i in zip(pieces, ids, strict=True)
    )
    # non-ASCII text round-trips too (byte level)
    assert tok.decode(tok.encode("héllo ∑ 日本", add_special_tokens=False)) == "héllo ∑ 日本"

    msgs = [{"role": "user", "content": "57+8="}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>57+8=<|end|><|assistant|>"
    assert len(tok.encode(prompt, add_special_tokens=False)) == 8
    conv = [{"role": "system", "content": "S"}, *msgs, {"role": "assistant", "content": "\\boxed{65}"}]
    assert (
        tok.apply_chat_template(conv, tokenize=False)
        == "<|system|>S<|end|><|user|>57+8=<|end|><|assistant|>\\boxed{65}<|end|>"
    )


def test_model_loads_and_generates(model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    arch, d = model_dir
    model = AutoModelForCausalLM.from_pretrained(str(d))
    tok = AutoTokenizer.from_pretrained(str(d))
    cfg = AutoConfig.from_pretrained(str(d))
    assert cfg.model_type == arch
    assert cfg.vocab_size == len(tok)
    n = sum(p.numel() for p in model.parameters())
    assert 50_000 < n < 1_000_000
    gen = GenerationConfig.from_pretrained(str(d))
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    ids = torch.tensor([tok.encode("<|user|>1+2=<|end|><|assistant|>", add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= ids.shape[1] + 4


def test_deterministic_and_fast(tmp_path):
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    a = build_tiny_model(tmp_path / "a", seed=3)
    assert time.perf_counter() - t0 < 10
    b = build_tiny_model(tmp_path / "b", seed=3)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_bad_arguments(tmp_path):
    with pytest.raises(SlimeError, match="--arch"):
        build_tiny_model(tmp_path / "x", arch="gpt2")
    with pytest.raises(SlimeError, match="--num-heads"):
        build_tiny_model(tmp_path / "x", hidden_size=60, num_attention_heads=7)
    with pytest.raises(SlimeError, match="--num-kv-heads"):
        build_tiny_model(tmp_path / "x", num_attention_heads=4, num_key_value_heads=3)
    (tmp_path / "file").write_text("")
    with pytest.raises(SlimeError, match="not a directory"):
        build_tiny_model(tmp_path / "file")


def test_cli(tmp_path, capsys):
    assert (
        tiny_model.main(
            [
                "--out",
                str(tmp_path / "m"),
                "--arch",
                "llama",
                "--hidden-size",
                "32",
                "--num-heads",
                "2",
                "--num-kv-heads",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "parameters" in out and "vocab" in out
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 32


def test_added_tokens_are_single_ordinary_tokens(tmp_path):
    """`added_tokens` (the agent example's tool-call boilerplate): each is one ordinary token after
    the trained vocabulary, survives the save/load round trip and decodes back as itself; duplicates
    and tokens already in the vocabulary are refused."""
    from transformers import AutoTokenizer

    from slime.data.tiny_model import build_tiny_model

    extra = ('<tool_call>{"name":"calculator","arguments":{"expression":"', '"}}</tool_call>')
    plain = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "plain", seed=0))
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "calls", seed=0, added_tokens=extra))
    assert len(tok) == len(plain) + 2
    text = f"{extra[0]}57+8{extra[1]}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids(extra[0]) >= len(plain) and len(ids) <= 8
    assert tok.decode(ids) == text
    assert len(plain(text, add_special_tokens=False)["input_ids"]) > 30
    assert "57+8" == tok.decode(ids[1:-1])
    for bad in ((extra[0], extra[0]), ("<|end|>",)):
        with pytest.raises(SlimeError):
            build_tiny_model(tmp_path / "bad", added_tokens=bad)
