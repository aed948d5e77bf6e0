"""Token texts for `slime report`'s rollout browser, with byte-level pieces shown as bytes.

A byte-level BPE (GPT-2's alphabet, the tiny model's, Qwen's, Llama 3's) or a SentencePiece byte
fallback splits a character like "€" (E2 82 AC) into tokens that are not valid UTF-8 alone: decoded
one by one they read "�". `token_texts` shows such a token as its bytes, `<0xE2>`, from the token's
vocabulary piece. The sample log (slime.observability.sample_log) stores each token decoded alone;
`repair_sample_tokens` fixes the "�" of a log written that way at report time, given the run's
tokenizer (loaded from the run's --hf-checkpoint, a local directory, when it is still there).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "REPLACEMENT",
    "load_tokenizer",
    "needs_repair",
    "piece_bytes",
    "repair_sample_tokens",
    "show_bytes",
    "token_texts",
]

REPLACEMENT = "\ufffd"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, reversed: the byte each character of a byte-level piece stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})  # the rest shifted past 255, in order
    return table


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for (byte-level BPE or `<0xNN>`); None for other pieces."""
    m = _BYTE_PIECE.fullmatch(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    table = _byte_decoder()
    if piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return None


def show_bytes(raw: bytes) -> str:
    """The valid UTF-8 of `raw` as text, every other byte as `<0xNN>`."""
    text = raw.decode("utf-8", errors="surrogateescape")  # an invalid byte b -> U+DC00 + b
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def _shown(text: str, piece: Any) -> str:
    if REPLACEMENT not in text or not isinstance(piece, str):
        return text
    raw = piece_bytes(piece)
    return text if raw is None else show_bytes(raw)


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id decoded alone; a piece that is not whole UTF-8 alone shown as its bytes (`<0xE2>`)."""
    texts = [str(t) for t in tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)]
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    return [_shown(t, p) for t, p in zip(texts, pieces, strict=True)]


@lru_cache(maxsize=2)
def load_tokenizer(path: str | None) -> Any:
    """The tokenizer of a local checkpoint directory, or None (no such directory, or it does not load)."""
    if not path or not Path(path).is_dir():
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure: the browser keeps the texts the log has
        return None


def needs_repair(sample: dict[str, Any]) -> bool:
    """Whether a logged sample has a token that reads "�" (and the ids to re-derive it)."""
    tokens = sample.get("response_tokens")
    return bool(tokens and sample.get("response_ids") and any(REPLACEMENT in str(t) for t in tokens))


def repair_sample_tokens(sample: dict[str, Any], tokenizer: Any) -> bool:
    """Re-derive a logged sample's `response_tokens` when one reads "�"; True when it did."""
    if tokenizer is None or not needs_repair(sample):
        return False
    try:
        sample["response_tokens"] = token_texts(tokenizer, sample["response_ids"])
    except Exception:  # noqa: BLE001 - ids this tokenizer does not know: the log's texts stay
        return False
    return True
