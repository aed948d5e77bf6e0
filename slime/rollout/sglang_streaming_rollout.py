"""slime's streaming per-sample generate (`slime.rollout.sglang_streaming_rollout`):

    --custom-generate-function-path slime.rollout.sglang_streaming_rollout.generate_streaming

`generate_streaming(args, sample, sampling_params)` does what the default `generate` does (prompt
or partial sample in, tokens, text and log-probs out; `max_new_tokens` reduced by the response a
partial sample already has, and cut to --rollout-max-context-len) but asks `/generate` for a
server-sent-event stream (`stream: true`) and writes the answer so far onto the sample after every
chunk. The gain is on abort: when the rollout stops its long tail (`--partial-rollout`, a weight
update) the sample already holds everything generated until then, whether or not the engine's
answer to the abort carries it.

The chunks are SGLang's: `data: {json}` lines, each holding the whole answer of this call so far
(`text`, `meta_info.output_token_logprobs` as `[log-prob, token id, ...]` items, `finish_reason`
on the last one), then `data: [DONE]`. Each chunk therefore replaces the previous one's part of
the sample rather than adding to it. The built-in engine's `/generate` answers in one piece and
refuses `stream: true`; this generate function is for SGLang engines.
"""

from __future__ import annotations

import contextlib
import json
import logging
from argparse import Namespace
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from slime.errors import SlimeError
from slime.rollout.generation import (
    GenerateState,
    _resume_point,
    _truncated_before_start,
    context_limit,
    engine_url,
    fit_context,
)
from slime.utils.api_keys import auth_headers
from slime.utils.http_utils import (
    EngineRequestFailed,
    EngineTimeout,
    EngineUnreachable,
    _error_message,
    _session,
    session_headers,
)
from slime.utils.types import Sample

__all__ = ["generate_streaming"]

logger = logging.getLogger(__name__)

_DATA = "data:"


@dataclass
class _Before:
    """The sample's response-side fields before this call: each chunk is applied on top of them."""

    tokens: list[int]
    response: str
    response_length: int
    loss_mask: list[int] | None
    rollout_log_probs: list[float] | None
    top_p_token_ids: Any
    top_p_token_offsets: Any

    @classmethod
    def of(cls, sample: Sample) -> _Before:
        return cls(
            list(sample.tokens),
            sample.response or "",
            sample.response_length,
            None if sample.loss_mask is None else list(sample.loss_mask),
            None if sample.rollout_log_probs is None else list(sample.rollout_log_probs),
            sample.rollout_top_p_token_ids,
            sample.rollout_top_p_token_offsets,
        )

    def restore(self, sample: Sample) -> None:
        sample.tokens = list(self.tokens)
        sample.response = self.response
        sample.response_length = self.response_length
        sample.loss_mask = None if self.loss_mask is None else list(self.loss_mask)
        sample.rollout_log_probs = None if self.rollout_log_probs is None else list(self.rollout_log_probs)
        sample.rollout_top_p_token_ids = self.top_p_token_ids
        sample.rollout_top_p_token_offsets = self.top_p_token_offsets


def _chunk_of(line: str) -> dict | None:
    """One SSE line -> its JSON chunk; None for anything else (blank lines, comments, [DONE])."""
    if not line.startswith(_DATA):
        return None
    data = line[len(_DATA) :].strip()
    if not data or data == "[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        logger.warning("generate_streaming: skipping a chunk that is not JSON: %r", data[:120])
        return None
    return chunk if isinstance(chunk, dict) else None


async def _stream_chunks(url: str, payload: dict, headers: dict[str, str] | None) -> AsyncIterator[dict]:
    """POST `payload` to `url` and yield its SSE chunks as they arrive. One attempt: a retried stream
    would start the answer over. Errors are http_utils' (a 4xx/5xx, no answer, a timeout)."""
    session = await _session()
    try:
        async with session.post(url, json=payload, headers=auth_headers(url, headers)) as resp:
            if resp.status >= 400:
                text = await resp.text(errors="replace")
                raise EngineRequestFailed(
                    f"POST {url}: HTTP {resp.status}: {_error_message(resp.status, text)}", resp.status, url
                )
            # readline, not iteration by chunk: an SSE event may arrive split over TCP reads
            while raw := await resp.content.readline():
                chunk = _chunk_of(raw.decode("utf-8", errors="replace").strip())
                if chunk is not None:
                    yield chunk
    except TimeoutError as e:  # aiohttp's timeouts subclass it
        raise EngineTimeout(f"POST {url}: the stream timed out: {e}", None, url) from e
    except aiohttp.ClientError as e:
        raise EngineUnreachable(f"POST {url}: the stream broke: {e}", None, url) from e


def _apply_chunk(args: Namespace, sample: Sample, before: _Before, chunk: dict, last: tuple) -> tuple:
    """Put the call's answer so far (`chunk`, cumulative) on the sample, on top of `before`.
    `last` is the previous chunk's (text, tokens, log-probs): a chunk without a field keeps it."""
    meta = chunk.get("meta_info") or {}
    text, tokens, log_probs = last
    text = chunk.get("text", text)
    if "output_token_logprobs" in meta:
        items = meta["output_token_logprobs"]
        tokens, log_probs = [int(i[1]) for i in items], [float(i[0]) for i in items]
    before.restore(sample)
    sample.append_response_tokens(
        args,
        tokens=tokens,
        log_probs=log_probs,
        trainable=True,
        meta_info=meta,
        text=text,
        update_terminal_info=bool(meta.get("finish_reason")),
    )
    return text, tokens, log_probs


async def generate_streaming(
    args: Namespace, sample: Sample, sampling_params: dict[str, Any], *, evaluation: bool = False
) -> Sample:
    """Generate one sample over a streamed `/generate` (slime's signature; `evaluation`, passed by
    the eval rollout as to `generate`, selects the eval context length). The sample holds the answer
    so far after every chunk. An abort of the rollout (`GenerateState.aborted`) stops reading: the
    sample is ABORTED with what it had unless the engine had already finished it. A stream that ends
    without a finish reason raises (the sample is then FAILED by the caller)."""
    state = GenerateState(args)
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise SlimeError(f"generate_streaming: sample {sample.index} is {sample.status.value}, not pending or aborted")
    if state.aborted:  # the rollout is collecting its long tail: do not start new work
        sample.status = Sample.Status.ABORTED
        return sample
    input_ids, params = _resume_point(args, sample, sampling_params)
    params = fit_context(params, len(input_ids), context_limit(args, evaluation))
    if params.get("max_new_tokens") is not None and params["max_new_tokens"] <= 0:
        return _truncated_before_start(sample, input_ids)
    if sample.response_length == 0:  # a fresh sample: the prompt, an empty response
        sample.tokens, sample.response, sample.loss_mask, sample.rollout_log_probs = list(input_ids), "", [], []
        sample.weight_versions = []
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True, "stream": True}
    before = _Before.of(sample)
    last: tuple = ("", [], [])
    finished = False
    stream = _stream_chunks(engine_url(args), payload, session_headers(sample.session_id))
    try:
        async with contextlib.aclosing(stream) as chunks:  # leaving early closes the connection now
            async for chunk in chunks:
                last = _apply_chunk(args, sample, before, chunk, last)
                finished = bool((chunk.get("meta_info") or {}).get("finish_reason"))
                if state.aborted:
                    break
    except (EngineUnreachable, EngineTimeout):
        if not state.aborted:
            raise
        # an engine may drop an aborted request instead of ending its stream: still an abort
    if finished:
        return sample
    if state.aborted:
        sample.status = Sample.Status.ABORTED
        return sample
    raise EngineUnreachable(
        f"POST {engine_url(args)}: the stream ended before the answer finished (no finish_reason)",
        None,
        engine_url(args),
    )
