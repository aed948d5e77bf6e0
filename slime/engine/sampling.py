"""Sampling parameters (SGLang's names) and the batched sampler of the built-in engine.

Log-prob semantics (what `output_token_logprobs` / `input_token_logprobs` report)
--------------------------------------------------------------------------------
The reported log-prob of a token is ``log_softmax(logits / T)[token]`` computed in fp32, where
``T`` is the request's temperature, or the raw ``log_softmax(logits)`` when ``T == 0`` (greedy;
SGLang does the same: it treats temperature 0 as temperature 1 plus top-k 1). Truncations that
only shape *which* token is drawn -- ``top_p``, ``top_k``, ``min_p`` and the EOS/stop-token
suppression of ``min_new_tokens`` -- do **not** change the reported log-prob. This is what an RL
trainer recomputes from the same weights (logits / temperature, full vocabulary), so the
rollout log-probs and the trainer's agree up to float noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


class BadRequest(ValueError):
    """A malformed request; the server answers HTTP 400 with this message. `param`: the request
    field at fault, where one is (the OpenAI-compatible routes report it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# Parameters SGLang accepts that this engine does not implement: allowed only at their neutral
# value, so a client that sends the defaults works and one that relies on them hears about it.
_NEUTRAL_ONLY: dict[str, Any] = {
    "n": 1,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "stop_regex": None,
}
# Accepted and ignored (they only change formatting or streaming details).
_IGNORED = {"spaces_between_special_tokens", "stream_interval", "custom_params"}


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    # 128 when absent; an explicit null means "up to the context length" (SGLang's scheduler
    # clamps a None to the room left), resolved per request once the prompt length is known
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-6

    @property
    def stop_max_bytes(self) -> int:
        """The longest stop string in UTF-8 bytes: how far back a new token can complete one."""
        return max((len(s.encode("utf-8", "surrogatepass")) for s in self.stop), default=0)

    @classmethod
    def from_dict(cls, d: Any, *, vocab_size: int, where: str = "sampling_params") -> SamplingParams:
        """`where`: the prefix of field names in error messages ("" names the bare fields)."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise BadRequest(f"{where} must be an object, got {type(d).__name__}", param=where or None)

        def name(key: str) -> str:
            return f"{where}.{key}" if where else key

        p = cls()
        for key, value in d.items():
            if key in _IGNORED:
                continue
            if key in _NEUTRAL_ONLY:
                if value is not None and value != _NEUTRAL_ONLY[key]:
                    raise BadRequest(
                        f"{name(key)}={value!r} is not supported by the built-in engine (only {_NEUTRAL_ONLY[key]!r})",
                        param=key,
                    )
                continue
            if key not in _FIELDS:
                raise BadRequest(f"unknown sampling parameter {name(key)!r}", param=key)
            if value is None:  # null means "default", as in SGLang (for max_new_tokens: no limit of its own)
                if key == "max_new_tokens":
                    p.max_new_tokens = None
                continue
            setattr(p, key, _FIELDS[key](value, name(key), vocab_size))
        p._check_ranges(name)
        return p

    def _check_ranges(self, name) -> None:
        def bad(key: str, rule: str, value: Any) -> BadRequest:
            return BadRequest(f"{name(key)} must be {rule}, got {value}", param=key)

        if self.top_p <= 0.0 or self.top_p > 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", "-1 (disabled) or >= 1", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if self.temperature < 0:
            raise bad("temperature", ">= 0", self.temperature)
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise bad("max_new_tokens", ">= 0", self.max_new_tokens)
        if self.min_new_tokens < 0 or (self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens):
            raise bad("min_new_tokens", f"in [0, max_new_tokens={self.max_new_tokens}]", self.min_new_tokens)


def _field(name: str) -> str:
    """'sampling_params[0].top_p' -> 'top_p'."""
    return name.rsplit(".", 1)[-1]


def _as_float(v: Any, name: str, _vocab: int) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"{name} must be a finite number, got {v!r}", param=_field(name))
    return float(v)


def _as_int(v: Any, name: str, _vocab: int) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, got {v!r}", param=_field(name))
    return v


def _as_bool(v: Any, name: str, _vocab: int) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{name} must be true or false, got {v!r}", param=_field(name))
    return v


# Stop strings are searched after every new token of the request: bounded in number and in total
# length, so that one request cannot make each decode step slow for every other (20k stop strings
# in a 0.4 MB body once made 16 short requests take seconds).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096


def _as_stop(v: Any, name: str, _vocab: int) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise BadRequest(
            f"{name} must be a non-empty string or a list of non-empty strings, got {str(v)[:200]!r}",
            param=_field(name),
        )
    if len(v) > MAX_STOP_STRINGS:
        raise BadRequest(
            f"{name} has {len(v)} stop strings; at most {MAX_STOP_STRINGS} are accepted", param=_field(name)
        )
    if sum(map(len, v)) > MAX_STOP_CHARS:
        raise BadRequest(
            f"{name} holds {sum(map(len, v))} characters; at most {MAX_STOP_CHARS} in all are accepted",
            param=_field(name),
        )
    return list(v)


def _as_token_ids(v: Any, name: str, vocab: int) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list):
        raise BadRequest(f"{name} must be a list of token ids, got {v!r}", param=_field(name))
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise BadRequest(f"{name} contains {t!r}, not a token id in [0, {vocab})", param=_field(name))
    return list(v)


def _as_seed(v: Any, name: str, vocab: int) -> int:
    s = _as_int(v, name, vocab)
    return s & 0xFFFF_FFFF_FFFF_FFFF


_FIELDS = {
    "temperature": _as_float,
    "top_p": _as_float,
    "top_k": _as_int,
    "min_p": _as_float,
    "max_new_tokens": _as_int,
    "min_new_tokens": _as_int,
    "stop": _as_stop,
    "stop_token_ids": _as_token_ids,
    "skip_special_tokens": _as_bool,
    "no_stop_trim": _as_bool,
    "ignore_eos": _as_bool,
    "sampling_seed": _as_seed,
}


def top_logprobs(logprobs: torch.Tensor, rows: list[tuple[int, int]]) -> dict[int, tuple[list[float], list[int]]]:
    """{row: (its k best log-probs, their token ids)} for each (row, k) of `rows`; one topk call."""
    idx = torch.tensor([i for i, _ in rows], dtype=torch.long, device=logprobs.device)
    k = min(max(k for _, k in rows), logprobs.shape[-1])
    values, ids = logprobs.index_select(0, idx).topk(k, dim=-1)
    values_l, ids_l = values.tolist(), ids.tolist()
    return {i: (values_l[j][:want], ids_l[j][:want]) for j, (i, want) in enumerate(rows)}


class BatchSampler:
    """Per-row sampling for one batch, with the per-row parameters packed into tensors once.

    `rows` are objects with `.params` (SamplingParams) and `.generator` (torch.Generator or None).
    Sampling is by inverse CDF: one uniform number per row and step. Rows without a seed draw it
    from `default_generator` in one batched call; seeded rows draw theirs from their own
    generator, so a seeded request samples the same tokens whatever batch it lands in (up to
    float noise in the logits).
    """

    def __init__(self, rows: list[Any], vocab_size: int, default_generator: torch.Generator):
        self.vocab_size = vocab_size
        self.default_generator = default_generator
        self._set_rows(rows)

    def _set_rows(self, rows: list[Any]) -> None:
        self.rows = rows
        ps = [r.params for r in rows]
        self.greedy = torch.tensor([p.greedy for p in ps], dtype=torch.bool)
        self.all_greedy = bool(self.greedy.all())
        self.any_greedy = bool(self.greedy.any())
        self.temps = torch.tensor([1.0 if p.greedy else p.temperature for p in ps], dtype=torch.float32)
        self.all_temp_one = bool((self.temps == 1.0).all())
        v = self.vocab_size
        self.top_k = torch.tensor([v if p.top_k < 0 else min(p.top_k, v) for p in ps], dtype=torch.long)
        self.top_p = torch.tensor([p.top_p for p in ps], dtype=torch.float32)
        self.min_p = torch.tensor([p.min_p for p in ps], dtype=torch.float32)
        sampled = [not p.greedy for p in ps]
        self.need_filter = any(
            s and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0) for s, p in zip(sampled, ps, strict=True)
        )
        self.seeded = [i for i, r in enumerate(rows) if r.generator is not None]
        # rows that asked for the top-k log-probs of every step (`top_logprobs_num`)
        self.top_rows = [(i, k) for i, r in enumerate(rows) if (k := getattr(r, "top_logprobs_num", 0)) > 0]
        self.last_top: dict[int, tuple[list[float], list[int]]] | None = None

    def select(self, keep: list[int]) -> None:
        """Keep only these row positions (rows that finished leave the batch)."""
        self._set_rows([self.rows[i] for i in keep])

    def sample(self, logits: torch.Tensor, suppress: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: [B, V] fp32. suppress: optional [B, V] bool of tokens that must not be drawn
        (min_new_tokens). Returns (tokens [B] long, logprobs [B] fp32); the top-k log-probs of the
        rows that asked for them are left in `last_top` ({row: (log-probs, token ids)}, best first)."""
        scaled = logits if self.all_temp_one else logits / self.temps.unsqueeze(1)
        logprobs_all = torch.log_softmax(scaled, dim=-1)
        self.last_top = top_logprobs(logprobs_all, self.top_rows) if self.top_rows else None
        if suppress is not None:
            scaled = scaled.masked_fill(suppress, float("-inf"))
        if self.all_greedy:
            tokens = scaled.argmax(dim=-1)
        else:
            tokens = self._sample(scaled)
            if self.any_greedy:
                tokens = torch.where(self.greedy, scaled.argmax(dim=-1), tokens)
        logprobs = logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
        return tokens, logprobs

    def _sample(self, scaled: torch.Tensor) -> torch.Tensor:
        if self.need_filter:
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            ranks = torch.arange(scaled.shape[1]).unsqueeze(0)
            keep = ranks < self.top_k.unsqueeze(1)
            cum = sorted_probs.cumsum(dim=-1)
            keep &= (cum - sorted_probs) < self.top_p.unsqueeze(1)  # the top token is always kept
            keep &= sorted_probs >= self.min_p.unsqueeze(1) * sorted_probs[:, :1]
            picked = self._inverse_cdf(sorted_probs * keep)
            return order.gather(1, picked.unsqueeze(1)).squeeze(1)
        return self._inverse_cdf(torch.softmax(scaled, dim=-1))

    def _inverse_cdf(self, probs: torch.Tensor) -> torch.Tensor:
        """One uniform number per row: the first token whose cumulative mass exceeds it.

        `probs` may be unnormalised (truncated); tokens with zero mass are never drawn.
        """
        cdf = probs.cumsum(dim=-1)
        u = torch.rand((probs.shape[0], 1), generator=self.default_generator)
        for i in self.seeded:
            u[i] = torch.rand(1, generator=self.rows[i].generator)
        u.mul_(cdf[:, -1:])
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_max_(probs.shape[1] - 1)
