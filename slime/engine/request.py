"""One generation request's life in the engine: a `/generate` body in, `Req`s through the
scheduler, SGLang's answer shape out.

* `parse_generate(body, runner, max_total_tokens)` validates a body (single prompt or a batch)
  and returns the `Req`s; anything wrong raises `BadRequest` naming the field and the index.
* `Req` carries what the scheduler needs and what it fills in while the request runs.
* `result_of(req, tokenizer, weight_version)` is the JSON answer (`text`, `output_ids`,
  `meta_info` with `finish_reason`, token counts and log-probs).
* `encode_text`, `check_token_ids` and `make_request` are the same steps for other front ends
  (the OpenAI-compatible routes): one prompt's token ids, checked, into a `Req` that fits.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from slime.engine.sampling import BadRequest, SamplingParams

# Top-level /generate fields accepted only at their neutral value (the feature is not built in).
_NEUTRAL_FIELDS: dict[str, Any] = {
    "stream": False,
    "token_ids_logprob": None,
    "lora_path": None,
    "lora_id": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "input_embeds": None,
    "return_hidden_states": False,
    "return_routed_experts": False,
    "custom_logit_processor": None,
    "session_params": None,
    # sglang-router (0.3.x) fills these in on every request it forwards:
    "return_bytes": False,
    "return_entropy": False,
}
_IGNORED_FIELDS = {
    "log_metrics",
    "modalities",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "data_parallel_rank",
    "routed_dp_rank",
    "priority",
    "extra_key",
    "background",
    "no_logs",
    "conversation_id",
    "label",
    "received_time",
    "custom_labels",
    "routing_key",
    "model",  # sglang-router adds the served model name when it forwards a request
}
_FIELDS = {
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "rid",
    "return_text_in_logprobs",
    "top_logprobs_num",
}
# the most alternatives one token's top log-probs may list (`top_logprobs_num`): each costs every
# step a top-k and the answer a [log-prob, id, text] triple per token
MAX_TOP_LOGPROBS = 256


@dataclass(eq=False)
class Req:
    input_ids: list[int]
    params: SamplingParams
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    return_logprob: bool = False
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    top_logprobs_num: int = 0  # with return_logprob: the k best log-probs of every position too
    # filled while it runs
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[tuple[list[float], list[int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[tuple[list[float], list[int]] | None] | None = None
    finish_reason: dict | None = None
    stop_str_pos: int | None = None  # where a matched stop string starts in the decoded text
    stop_checked: int = 0  # output tokens already searched for stop strings
    generator: torch.Generator | None = None
    stop_ids: frozenset = frozenset()
    created: float = field(default_factory=time.perf_counter)
    weight_version: str = ""
    cached_tokens: int = 0  # prompt tokens not prefilled: shared with another request or from the prefix cache
    kv_epoch: int = -1  # the runner's weights_epoch when this request's KV was (re)computed
    error: BaseException | None = None
    delivered: bool = False
    # delivery: the server sets these
    future: Any = None
    loop: Any = None
    on_token: Callable[[], None] | None = None  # called on the worker thread after each new token (streaming)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        """The cap on new tokens, resolved before the request is queued (`_with_room`)."""
        new = self.params.max_new_tokens
        assert new is not None, "max_new_tokens is resolved when a request is built"
        return new

    def kv_need(self) -> int:
        """Cache positions this request may take by its end (prompt + every new token)."""
        return len(self.input_ids) + self.max_new_tokens

    def num_tokens(self) -> int:
        return len(self.input_ids) + len(self.output_ids)


# ------------------------------------------------------------------------------------ parsing
def parse_generate(body: Any, runner, max_total_tokens: int | None) -> tuple[list[Req], bool]:
    """Validate a /generate body; returns (the requests, whether it was a batch)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_fields(body)
    prompts, is_batch = _prompts(body, runner)
    n = len(prompts)
    columns = {
        name: _per_item(body.get(name, default), n, name, is_batch)
        for name, default in (
            ("sampling_params", None),
            ("return_logprob", False),
            ("logprob_start_len", -1),
            ("return_text_in_logprobs", False),
            ("top_logprobs_num", 0),
        )
    }
    rid = body.get("rid")
    if is_batch and rid is not None and not isinstance(rid, list):
        raise BadRequest("rid must be a list of strings for a batch request")
    columns["rid"] = _per_item(rid, n, "rid", is_batch)
    params_of: dict[int, SamplingParams] = {}  # a batch usually shares one sampling_params object
    reqs = []
    for b, ids in enumerate(prompts):
        where = f"[{b}]" if is_batch else ""
        raw = columns["sampling_params"][b]
        if id(raw) not in params_of:
            params_of[id(raw)] = SamplingParams.from_dict(
                raw, vocab_size=runner.vocab_size, where=f"sampling_params{where}"
            )
        fields = _checked_fields({k: v[b] for k, v in columns.items()}, where, runner.vocab_size)
        reqs.append(make_request(ids, params_of[id(raw)], runner, max_total_tokens, where=where, **fields))
    return reqs, is_batch


def make_request(
    ids: list[int],
    sp: SamplingParams,
    runner,
    max_total_tokens: int | None,
    *,
    where: str = "",
    new_tokens_name: str = "max_new_tokens",
    **fields: Any,
) -> Req:
    """A `Req` for checked prompt ids, with its max_new_tokens resolved; BadRequest when the prompt
    and its new tokens do not fit the context or the KV budget (`new_tokens_name` names the cap
    in that message). `fields`: `Req` fields (return_logprob, logprob_start_len, rid, ...)."""
    sp = _with_room(sp, len(ids), where, runner.context_length, max_total_tokens)
    rid = fields.pop("rid", None)
    stop_ids = set(sp.stop_token_ids)
    if not sp.ignore_eos:
        stop_ids |= runner.eos_token_ids
    req = Req(input_ids=list(ids), params=sp, stop_ids=frozenset(stop_ids), **fields)
    if rid is not None:
        req.rid = rid
    if sp.sampling_seed is not None:
        req.generator = torch.Generator().manual_seed(sp.sampling_seed)
    _check_fits(req, where, runner.context_length, max_total_tokens, new_tokens_name)
    return req


def _check_fields(body: dict) -> None:
    for key, value in body.items():
        if key in _FIELDS or key in _IGNORED_FIELDS:
            continue
        if key in _NEUTRAL_FIELDS:
            if value not in (None, _NEUTRAL_FIELDS[key]):
                raise BadRequest(f"{key}={value!r} is not supported by the built-in engine")
            continue
        raise BadRequest(f"unknown field {key!r} in /generate request")


def _prompts(body: dict, runner) -> tuple[list[list[int]], bool]:
    """The prompts as token ids (from `input_ids`, or `text` tokenized), and whether it is a batch."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("give exactly one of 'text' and 'input_ids'")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise BadRequest("input_ids must be a non-empty list of token ids (or a list of such lists)")
        is_batch = isinstance(input_ids[0], list)
        prompts = input_ids if is_batch else [input_ids]
        for b, ids in enumerate(prompts):
            check_token_ids(ids, f"input_ids[{b}]" if is_batch else "input_ids", runner.vocab_size)
        return prompts, is_batch
    is_batch = isinstance(text, list)
    texts = text if is_batch else [text]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("text must be a string or a non-empty list of strings")
    for b, t in enumerate(texts):  # every length first: none is tokenized if one is too long
        check_text_length(t, f"text[{b}]" if is_batch else "text", runner)
    return [encode_text(t, f"text[{b}]" if is_batch else "text", runner) for b, t in enumerate(texts)], is_batch


def check_token_ids(ids: Any, name: str, vocab: int) -> None:
    if not isinstance(ids, list) or not ids:
        raise BadRequest(f"{name} must be a non-empty list of token ids", param=name.split("[", 1)[0])
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise BadRequest(f"{name} contains {t!r}, not a token id in [0, {vocab})", param=name.split("[", 1)[0])


def check_text_length(text: str, name: str, runner) -> None:
    """Refused before tokenizing (which takes seconds for megabytes): a text longer than this
    cannot encode to fewer tokens than the context length."""
    if len(text) > runner.max_prompt_chars:
        raise BadRequest(
            f"{name} has {len(text)} characters, more than the context length can hold "
            f"({runner.context_length} tokens of at most {runner.max_token_chars} characters each: "
            f"{runner.max_prompt_chars}); send a shorter text",
            param=name.split("[", 1)[0],
        )


def encode_text(text: str, name: str, runner, *, add_special_tokens: bool = True) -> list[int]:
    """`text`'s token ids (its length checked first); BadRequest when it encodes to none."""
    check_text_length(text, name, runner)
    ids = list(runner.tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if not ids:
        raise BadRequest(f"{name} encodes to no tokens", param=name.split("[", 1)[0])
    return ids


def _per_item(value: Any, n: int, name: str, is_batch: bool) -> list:
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries but the batch has {n} prompts")
        return value
    return [value] * n


def _checked_fields(fields: dict[str, Any], where: str, vocab: int) -> dict[str, Any]:
    """One /generate prompt's per-request fields, type-checked, as `Req` keyword arguments."""
    rl, tl, ls, r_id, top = (
        fields["return_logprob"],
        fields["return_text_in_logprobs"],
        fields["logprob_start_len"],
        fields["rid"],
        fields["top_logprobs_num"],
    )
    rl = False if rl is None else rl
    if not isinstance(rl, bool):
        raise BadRequest(f"return_logprob{where} must be true or false, got {rl!r}")
    if not isinstance(tl, bool):
        raise BadRequest(f"return_text_in_logprobs{where} must be true or false, got {tl!r}")
    ls = -1 if ls is None else ls
    if isinstance(ls, bool) or not isinstance(ls, int) or ls < -1:
        raise BadRequest(f"logprob_start_len{where} must be an integer >= -1, got {ls!r}")
    if r_id is not None and not isinstance(r_id, str):
        raise BadRequest(f"rid{where} must be a string, got {r_id!r}")
    top = 0 if top is None else top
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= min(MAX_TOP_LOGPROBS, vocab):
        raise BadRequest(
            f"top_logprobs_num{where} must be an integer in [0, {min(MAX_TOP_LOGPROBS, vocab)}], got {top!r}"
        )
    return {
        "return_logprob": rl,
        "return_text_in_logprobs": tl,
        "logprob_start_len": ls,
        "rid": r_id,
        "top_logprobs_num": top if rl else 0,
    }


def _with_room(
    sp: SamplingParams, n: int, where: str, context_length: int, max_total_tokens: int | None
) -> SamplingParams:
    """max_new_tokens null: every position the prompt leaves, less one (as SGLang's scheduler)."""
    if sp.max_new_tokens is not None:
        return sp
    limit = min(context_length, max_total_tokens or context_length)
    room = limit - n - 1
    if room < max(1, sp.min_new_tokens):
        raise BadRequest(f"prompt{where} has {n} tokens: no room left to generate within {limit} positions")
    return replace(sp, max_new_tokens=room)


def _check_fits(
    req: Req, where: str, context_length: int, max_total_tokens: int | None, new_name: str = "max_new_tokens"
) -> None:
    n, new = len(req.input_ids), req.max_new_tokens
    if n + new > context_length:
        raise BadRequest(
            f"prompt{where} has {n} tokens and {new_name} is {new}: "
            f"together more than the context length {context_length}",
            param=new_name,
        )
    if max_total_tokens is not None and n + new > max_total_tokens:
        raise BadRequest(
            f"prompt{where} has {n} tokens and {new_name} is {new}: together more than the "
            f"KV token budget {max_total_tokens} (--max-total-tokens / --mem-fraction-static)",
            param=new_name,
        )


# ------------------------------------------------------------------------------------ while it runs
TopLogprobs = tuple[list[float], list[int]]  # one position's k best (log-probs, token ids), best first


def input_logprobs(logits: torch.Tensor, r: Req) -> tuple[list[float | None], list[TopLogprobs | None] | None]:
    """Log-probs of prompt tokens from index `logprob_start_len` (the first token gets None), and
    with `top_logprobs_num` each position's top-k (else None). `logits` [len(prompt + output so
    far), V]: row t predicts token t + 1."""
    ids = r.input_ids
    n = len(ids)
    start = min(r.logprob_start_len, n)
    out: list[float | None] = []
    tops: list[TopLogprobs | None] | None = [] if r.top_logprobs_num > 0 else None
    first = start
    if start == 0:
        out.append(None)
        if tops is not None:
            tops.append(None)
        first = 1
    if first < n:
        temp = 1.0 if r.params.greedy else r.params.temperature
        rows = logits[first - 1 : n - 1]
        if temp != 1.0:
            rows = rows / temp
        lp = torch.log_softmax(rows, dim=-1)
        tgt = torch.tensor(ids[first:n], dtype=torch.long, device=lp.device).unsqueeze(1)
        out.extend(lp.gather(1, tgt).squeeze(1).tolist())
        if tops is not None:
            values, top_ids = lp.topk(min(r.top_logprobs_num, lp.shape[-1]), dim=-1)
            tops.extend(zip(values.tolist(), top_ids.tolist(), strict=True))
    return out, tops


def check_stop_strings(r: Req, tokenizer) -> None:
    """Finish `r` at the earliest stop string its decoded output contains.

    A step decodes only the tokens a new stop string can lie in: those since the last check and,
    before them, enough tokens to hold the longest stop string (every token carries at least one
    byte of text, and 3 more cover a character split at the window's start; skipped special tokens
    carry none and are looked past). A step costs as much as the stop strings are long, not as
    long as the output; the whole output is decoded once, on a match, to place it."""
    ids, p = r.output_ids, r.params
    specials = _special_ids(tokenizer) if p.skip_special_tokens else frozenset()
    start, need = r.stop_checked, p.stop_max_bytes + 3
    while start > 0 and need > 0:
        start -= 1
        need -= ids[start] not in specials
    r.stop_checked = len(ids)
    tail = tokenizer.decode(ids[start:], skip_special_tokens=p.skip_special_tokens)
    if not any(s in tail for s in p.stop):
        return
    text = tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
    best = None
    for s in p.stop:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    if best is not None:
        r.stop_str_pos = best[0]
        r.finish_reason = {"type": "stop", "matched": best[1]}


@functools.lru_cache(maxsize=8)
def _special_ids(tokenizer) -> frozenset[int]:
    return frozenset(tokenizer.all_special_ids)


# ------------------------------------------------------------------------------------ the answer
def result_of(r: Req, tokenizer, weight_version: str) -> dict:
    """SGLang's /generate answer for one finished (or aborted) request."""
    p = r.params
    fr = r.finish_reason or {"type": "abort"}
    ids = r.output_ids
    matched = fr.get("matched")
    if fr["type"] == "stop" and isinstance(matched, int) and not p.no_stop_trim:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens) if ids else ""
    if isinstance(matched, str) and not p.no_stop_trim and r.stop_str_pos is not None:
        text = text[: r.stop_str_pos]
    meta = {
        "id": r.rid,
        "finish_reason": fr,
        "prompt_tokens": len(r.input_ids),
        "completion_tokens": len(r.output_ids),
        "cached_tokens": r.cached_tokens,
        "weight_version": r.weight_version or weight_version,
        "e2e_latency": time.perf_counter() - r.created,
    }
    if r.return_logprob:
        with_text = r.return_text_in_logprobs
        meta["output_token_logprobs"] = _logprob_triples(r.output_logprobs, r.output_ids, tokenizer, with_text)
        if r.top_logprobs_num > 0:
            meta["output_top_logprobs"] = [_top_triples(t, tokenizer, with_text) for t in r.output_top_logprobs]
        if r.logprob_start_len >= 0:
            in_ids = r.input_ids[min(r.logprob_start_len, len(r.input_ids)) :]
            lps = r.input_logprobs or [None] * len(in_ids)
            meta["input_token_logprobs"] = _logprob_triples(lps, in_ids, tokenizer, with_text)
            if r.top_logprobs_num > 0:
                tops = r.input_top_logprobs or [None] * len(in_ids)
                meta["input_top_logprobs"] = [_top_triples(t, tokenizer, with_text) for t in tops]
    return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}


def _top_triples(top: TopLogprobs | None, tokenizer, with_text: bool) -> list[list] | None:
    """One position's top-k as SGLang's triples (None where there is none: a prompt's first token)."""
    return None if top is None else _logprob_triples(top[0], top[1], tokenizer, with_text)


def _logprob_triples(logprobs, ids, tokenizer, with_text: bool) -> list[list]:
    """SGLang's `[logprob, token_id, token_text or None]` per token."""
    if with_text:
        return [[lp, t, tokenizer.decode([t])] for lp, t in zip(logprobs, ids, strict=True)]
    return [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
