"""Byte-level tokens in `slime report`'s rollout browser (slime.observability.report_tokens): a token
that is not whole UTF-8 alone reads `<0xE2>`, not "�", with the tiny model's byte-level BPE."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from slime.observability import report, sample_log
from slime.observability.report_tokens import REPLACEMENT, piece_bytes, show_bytes, token_texts
from slime.utils.types import Sample

TEXT = "price €5 — 日本"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    from slime.data.tiny_model import build_tokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


def test_bytes_and_pieces():
    assert show_bytes(b" \xe2\x82") == " <0xE2><0x82>"
    assert show_bytes("€x".encode()) == "€x" and show_bytes(b"\xac5") == "<0xAC>5"
    assert piece_bytes("<0x0A>") == b"\n"  # SentencePiece's byte fallback
    assert piece_bytes("âĤ") == b"\xe2\x82" and piece_bytes("Ġ") == b" "  # GPT-2's byte alphabet
    assert piece_bytes("▁the") is None  # a SentencePiece word: no bytes to show


def test_token_texts_show_split_characters_as_bytes(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    plain = [str(t) for t in tok.batch_decode([[i] for i in ids])]
    assert REPLACEMENT in "".join(plain)  # what the sample log holds: decoded alone
    texts = token_texts(tok, ids)
    assert REPLACEMENT not in "".join(texts)
    assert "".join(texts).startswith("price <0xE2><0x82><0xAC>5 <0xE2><0x80><0x94> <0xE6>")
    assert [t for t, p in zip(texts, plain, strict=True) if REPLACEMENT not in p] == [
        p for p in plain if REPLACEMENT not in p
    ]  # whole tokens unchanged


def _log(run: Path, tok_dir: Path) -> None:
    run.mkdir()
    ids = [1, 2, *sample_log._tokenizer(str(tok_dir)).encode(TEXT, add_special_tokens=False)]
    s = Sample(index=0, group_index=0, prompt="p", tokens=ids, response=TEXT, reward=1.0)
    s.response_length = len(ids) - 2
    s.status = Sample.Status.COMPLETED
    args = Namespace(
        run_dir=str(run), stage=None, report_groups_per_rollout=1, hf_checkpoint=str(tok_dir), reward_key=None
    )
    sample_log.write_rollout_samples(args, [[s]], 0)


def _tokens(data: dict) -> list[str]:
    return data["rollouts"][0]["groups"][0]["samples"][0]["response_tokens"]


def test_report_shows_bytes_with_the_runs_tokenizer_and_says_when_it_cannot(tmp_path, tok_dir):
    run = tmp_path / "run"
    _log(run, tok_dir)
    path = run / "samples" / "rollout_000000.json"
    logged = json.loads(path.read_text())
    sample = logged["groups"][0]["samples"][0]
    assert "<0xE2><0x82><0xAC>" in "".join(sample["response_tokens"])  # the log holds the bytes itself
    # a log written before that (each token decoded alone: "�") is repaired with the run's tokenizer
    tokenizer = sample_log._tokenizer(str(tok_dir))
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    sample["response_tokens"] = [str(t) for t in tokenizer.batch_decode([[i] for i in ids])]
    assert REPLACEMENT in "".join(sample["response_tokens"])
    path.write_text(json.dumps(logged))
    (run / "args.json").write_text(json.dumps({"hf_checkpoint": str(tok_dir)}))
    data = report.collect(run)
    assert "<0xE2><0x82><0xAC>" in "".join(_tokens(data)) and REPLACEMENT not in "".join(_tokens(data))
    assert not any(REPLACEMENT in n for n in data["notes"])
    # the checkpoint is gone: the log's texts stay, and a note says why
    (run / "args.json").write_text(json.dumps({"hf_checkpoint": str(tmp_path / "gone")}))
    data = report.collect(run)
    assert REPLACEMENT in "".join(_tokens(data))
    assert any("1 logged samples" in n and "byte-level BPE" in n for n in data["notes"])
