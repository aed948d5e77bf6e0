"""A tiny, randomly initialised Hugging Face causal LM with its own tokenizer.

`build_tiny_model(out_dir)` writes a directory that `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load like any real checkpoint: `config.json`,
`model.safetensors`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` and a
chat template. It is what tests, examples and CPU runs train.

Tokenizer: a byte-level BPE trained here with the `tokenizers` library (so any text, ASCII or
not, tokenizes and decodes back exactly), using the same normaliser / pre-tokenizer pipeline as
Qwen2's tokenizer. That matters: for `model_type == "qwen2"` transformers' `AutoTokenizer` always
rebuilds the tokenizer as `Qwen2Tokenizer`, which replaces the pre-tokenizer with its own; since
ours is identical, the token ids are identical whichever class loads it. The pre-tokenizer splits
every digit on its own, so numbers are sequences of single-digit tokens (learnable by a tiny model).

Chat template (short, so prompts stay short): each message is `<|ROLE|>CONTENT<|end|>` and
`add_generation_prompt` appends `<|assistant|>`. `<|end|>` is the EOS token; `<|pad|>` pads.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    Qwen2Config,
    TokenizersBackend,
)
from transformers.utils import logging as hf_logging

from slime.errors import SlimeError

ARCHS = ("qwen2", "llama")

PAD_TOKEN = "<|pad|>"
END_TOKEN = "<|end|>"
ROLE_TOKENS = ("<|user|>", "<|assistant|>", "<|system|>", "<|tool|>")
SPECIAL_TOKENS = (PAD_TOKEN, END_TOKEN, *ROLE_TOKENS)

# Messages render as `<|ROLE|>CONTENT<|end|>` (a role without a special token is spelled out
# in plain characters); the generation prompt is `<|assistant|>`.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)

# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer uses exactly this pattern): `\p{N}`
# alone makes every digit its own pre-token, so no BPE merge ever contains a digit.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The class AutoTokenizer will instantiate for each architecture (written to tokenizer_config.json).
_TOKENIZER_CLASS = {"qwen2": "Qwen2Tokenizer", "llama": "TokenizersBackend"}

_ENGLISH = (
    "The answer is the sum of the two numbers. What is the result? Let's think step by step. "
    "First add the ones, then the tens, and carry when the sum is ten or more. "
    "Question: Answer: The final answer is boxed. Please reason and put your final answer "
    "within \\boxed{}. You are a helpful assistant. The user asks a question and the "
    "assistant solves it. Compute, calculate, solve, check, correct, wrong, true, false, "
    "number, numbers, digit, digits, plus, minus, equals, total, result."
)


def _training_corpus(seed: int) -> list[str]:
    """Text the BPE merges are learned from: printable ASCII, task text, a little English."""
    rng = random.Random(seed)
    printable = "".join(chr(c) for c in range(32, 127)) + "\n\t"
    corpus = [printable] * 2
    for _ in range(1500):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        corpus.append(f"{a}+{b}=")
        corpus.append(f"\\boxed{{{a + b}}}")
        corpus.append(f"The answer is \\boxed{{{a + b}}}.")
    corpus.extend([_ENGLISH] * 30)
    corpus.extend(_ENGLISH.split(". "))
    return corpus


def _train_tokenizer(vocab_size: int, seed: int):
    tok = Tokenizer(
        BPE(
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(seed), trainer=trainer)
    return tok


def build_tokenizer(
    *, vocab_size: int = 320, seed: int = 0, model_max_length: int = 256, added_tokens: Sequence[str] = ()
):
    """The tiny model's tokenizer as a transformers tokenizer (not saved anywhere).

    `added_tokens`: optional extra strings, each one ordinary (non-special) token after the trained
    vocabulary, matched in text before the BPE (e.g. a tool call's fixed JSON boilerplate, so a
    call is a few tokens); they decode back as themselves. None by default."""
    min_vocab = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_vocab:
        raise SlimeError(
            f"tiny model vocab_size={vocab_size} is too small: the byte-level tokenizer needs >= {min_vocab}"
        )
    raw = _train_tokenizer(vocab_size, seed)
    if added_tokens:
        if len(set(added_tokens)) != len(added_tokens) or not all(isinstance(t, str) and t for t in added_tokens):
            raise SlimeError(f"tiny model added_tokens must be distinct non-empty strings, got {list(added_tokens)!r}")
        clash = [t for t in added_tokens if t in SPECIAL_TOKENS or t in raw.get_vocab()]
        if clash:
            raise SlimeError(f"tiny model added_tokens {clash!r} are already in the vocabulary")
        raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    return TokenizersBackend(
        tokenizer_object=raw,
        bos_token=None,
        eos_token=END_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        padding_side="right",
        model_max_length=model_max_length,
    )


# Strings whose ids must survive the save/load round trip (checked at build time).
_PROBE_TEXTS = (
    "57+8=",
    "".join(chr(c) for c in range(32, 127)),
    "Hello, World!\n\tThe answer is \\boxed{1,000}.  x",
    "<|user|>12+3=<|end|><|assistant|>\\boxed{15}<|end|><|pad|>",
)


def build_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 192,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
    vocab_size: int = 320,
    seed: int = 0,
    added_tokens: Sequence[str] = (),
) -> Path:
    """Write a randomly initialised HF causal LM plus tokenizer to `out_dir`; return the path.

    `vocab_size` bounds the tokenizer (256 byte tokens + 6 special tokens + learned merges); the
    model's vocabulary is exactly the tokenizer's size (plus `added_tokens`, if any: see
    `build_tokenizer`; without them the files are exactly those of earlier versions).
    """
    _check_shape(
        arch,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        intermediate_size,
        max_position_embeddings,
    )
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SlimeError(f"--out {str(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(
        vocab_size=vocab_size, seed=seed, model_max_length=max_position_embeddings, added_tokens=added_tokens
    )
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    end_id = tokenizer.convert_tokens_to_ids(END_TOKEN)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=end_id,
        pad_token_id=pad_id,
    )
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=end_id, pad_token_id=pad_id)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a 0.5 MB file
    try:
        model.save_pretrained(out)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)

    # Record the class AutoTokenizer picks for this model_type, so the files say what loads them.
    cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["tokenizer_class"] = _TOKENIZER_CLASS[arch]
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    _check_round_trip(out, tokenizer, arch, extra_probes=tuple(added_tokens))
    return out


def _check_shape(
    arch: str,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
) -> None:
    if arch not in ARCHS:
        raise SlimeError(f"--arch {arch!r} is not supported by the tiny model; choose one of {', '.join(ARCHS)}")
    for name, value in (
        ("--hidden-size", hidden_size),
        ("--num-layers", num_hidden_layers),
        ("--num-heads", num_attention_heads),
        ("--num-kv-heads", num_key_value_heads),
        ("--intermediate-size", intermediate_size),
        ("max_position_embeddings", max_position_embeddings),
    ):
        if not isinstance(value, int) or value <= 0:
            raise SlimeError(f"{name} must be a positive integer, got {value!r}")
    if hidden_size % num_attention_heads:
        raise SlimeError(f"--hidden-size {hidden_size} must be divisible by --num-heads {num_attention_heads}")
    if num_attention_heads % num_key_value_heads:
        raise SlimeError(f"--num-heads {num_attention_heads} must be divisible by --num-kv-heads {num_key_value_heads}")


def _check_round_trip(out: Path, tokenizer, arch: str, extra_probes: tuple[str, ...] = ()) -> None:
    """The round trip must be exact: ids from the saved directory == ids from the trained tokenizer."""
    loaded = AutoTokenizer.from_pretrained(str(out))
    probes = _PROBE_TEXTS + tuple(f"<|assistant|>{t}12+3{t}<|end|>" for t in extra_probes)
    for text in probes:
        want = tokenizer.encode(text, add_special_tokens=False)
        got = loaded.encode(text, add_special_tokens=False)
        if want != got or len(loaded) != len(tokenizer):
            raise RuntimeError(
                f"tiny model tokenizer round trip is not exact for {arch} ({type(loaded).__name__}): "
                f"{text!r} -> {got} instead of {want}"
            )


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slime tiny-model", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument("--arch", choices=ARCHS, default="qwen2")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=192)
    p.add_argument("--max-position-embeddings", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    out = build_tiny_model(
        a.out,
        arch=a.arch,
        hidden_size=a.hidden_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        intermediate_size=a.intermediate_size,
        max_position_embeddings=a.max_position_embeddings,
        seed=a.seed,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)))
    n = count_parameters(model)
    vocab = model.config.vocab_size
    print(f"tiny {a.arch} model: {n:,} parameters, vocab {vocab} -> {out} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
