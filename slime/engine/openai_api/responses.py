"""Finished engine requests -> the answers of /v1/completions and /v1/chat/completions (SGLang's
shapes), and the pieces the stream shares: log-probs, finish reasons, usage, the parsed message.

Log-probs are the engine's (`slime.engine.sampling`: log_softmax of logits / temperature, the
same values /generate reports), for every output token the answer counts in `completion_tokens`
(a trimmed stop token included); their alternatives come from the same distribution, best first.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from slime.engine.chat import reply_messages, usage
from slime.engine.openai_api.protocol import Plan
from slime.engine.parsing import parse_model_output
from slime.engine.request import Req, TopLogprobs


def new_id(plan: Plan) -> str:
    return f"{'cmpl' if plan.kind == 'completion' else 'chatcmpl'}-{uuid.uuid4().hex}"


def envelope(plan: Plan, rid: str, created: int, choices: list[dict], chunk: bool = False) -> dict:
    if plan.kind == "completion":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if chunk else "chat.completion"
    return {"id": rid, "object": obj, "created": created, "model": plan.model, "choices": choices}


def finish_of(result: dict) -> tuple[str, Any]:
    """(finish_reason: stop | length | abort, matched_stop: the stop string or token id, or None)."""
    fr = result["meta_info"]["finish_reason"] or {"type": "abort"}
    return fr["type"], fr.get("matched")


def usage_of(plan: Plan, results: list[dict]) -> dict:
    """Each prompt's tokens once (its n samples share it), every sample's output tokens."""
    prompt = sum(len(plan.reqs[i * plan.n].input_ids) for i in range(plan.num_prompts))
    return usage(prompt, sum(r["meta_info"]["completion_tokens"] for r in results))


# ------------------------------------------------------------------------------------ non-streaming
def completion_response(plan: Plan, results: list[dict], tokenizer) -> dict:
    choices = []
    for i, (r, result) in enumerate(zip(plan.reqs, results, strict=True)):
        reason, matched = finish_of(result)
        prompt = prompt_text(plan, i, tokenizer) if plan.echo or plan.logprobs is not None else ""
        choice = {
            "index": i,
            "text": (prompt if plan.echo else "") + result["text"],
            "logprobs": None,
            "finish_reason": reason,
            "matched_stop": matched,
        }
        if plan.logprobs is not None:
            texts = TokenTexts(tokenizer)
            lp = legacy_logprobs(texts, r, 0, len(r.output_ids), 0 if plan.echo else len(prompt), prompt=plan.echo)
            choice["logprobs"] = lp
        if plan.return_token_ids:
            choice["token_ids"] = list(r.output_ids)
            choice["prompt_token_ids"] = list(r.input_ids)
        choices.append(choice)
    body = envelope(plan, new_id(plan), int(time.time()), choices)
    body["usage"] = usage_of(plan, results)
    return body


def chat_response(plan: Plan, results: list[dict], tokenizer) -> dict:
    choices = []
    for i, (r, result) in enumerate(zip(plan.reqs, results, strict=True)):
        reason, matched = finish_of(result)
        message, called = chat_message(plan, result["text"])
        choice = {
            "index": i,
            "message": message,
            "logprobs": None,
            "finish_reason": "tool_calls" if called else reason,
            "matched_stop": matched,
        }
        if plan.logprobs is not None:
            choice["logprobs"] = chat_logprobs(TokenTexts(tokenizer), r, 0, len(r.output_ids))
        if plan.return_token_ids:
            choice["token_ids"] = list(r.output_ids)
        if plan.return_prompt_token_ids:
            choice["prompt_token_ids"] = list(r.input_ids)
        choices.append(choice)
    body = envelope(plan, new_id(plan), int(time.time()), choices)
    body["usage"] = usage_of(plan, results)
    return body


def chat_message(plan: Plan, text: str) -> tuple[dict, bool]:
    """(the assistant message of an output text, whether it calls tools)."""
    if not plan.parses_output:
        return {"role": "assistant", "content": text}, False
    parsed = parse_model_output(
        text,
        tools_schema=plan.tools,
        tool_parser_name=plan.tool_parser,
        reasoning_parser_name=plan.reasoning_parser,
    )
    wire, _ = reply_messages(parsed)
    return wire, bool(parsed.tool_uses)


def prompt_text(plan: Plan, i: int, tokenizer) -> str:
    """Choice i's prompt as text: the request's own string, or its token ids decoded."""
    text = plan.prompt_texts[i // plan.n]
    return text if text is not None else tokenizer.decode(plan.reqs[i].input_ids)


# ------------------------------------------------------------------------------------ log-probs
class TokenTexts:
    """Token id -> its text (special tokens spelled out), decoded in one batch per lookup."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.known: dict[int, str] = {}

    def of(self, ids: list[int]) -> list[str]:
        missing = sorted({t for t in ids if t not in self.known})
        if missing:
            for t, text in zip(missing, self.tokenizer.batch_decode([[t] for t in missing]), strict=True):
                self.known[t] = text
        return [self.known[t] for t in ids]


def _token_lists(
    r: Req, start: int, end: int, prompt: bool
) -> tuple[list[int], list[float | None], list[TopLogprobs | None]]:
    """(ids, log-probs, top-k or None) of output tokens [start, end), with the prompt's before
    them when `prompt` (its first token has no log-prob)."""
    ids = list(r.output_ids[start:end])
    lps: list[float | None] = list(r.output_logprobs[start:end])
    tops: list[TopLogprobs | None] = list(r.output_top_logprobs[start:end]) or [None] * len(ids)
    if prompt:
        n = len(r.input_ids)
        ids = list(r.input_ids) + ids
        lps = list(r.input_logprobs or [None] * n) + lps
        tops = list(r.input_top_logprobs or [None] * n) + tops
    return ids, lps, tops


def legacy_logprobs(texts: TokenTexts, r: Req, start: int, end: int, offset: int, prompt: bool = False) -> dict:
    """OpenAI's completions log-probs of output tokens [start, end) (and the prompt's before them):
    `tokens`, `token_logprobs`, `top_logprobs` ({token text: log-prob}, best first; None where a
    position has none) and `text_offset` (each token's start in the text, counted from `offset`)."""
    ids, lps, tops = _token_lists(r, start, end, prompt)
    tokens = texts.of(ids)
    top_texts = texts.of([t for top in tops if top is not None for t in top[1]])
    top_dicts: list[dict | None] = []
    pos = 0
    for top in tops:
        if top is None:
            top_dicts.append(None if r.top_logprobs_num else {})
            continue
        d: dict[str, float] = {}
        for lp, text in zip(top[0], top_texts[pos : pos + len(top[1])], strict=True):
            d.setdefault(text, lp)  # two ids may decode alike: keep the better one
        pos += len(top[1])
        top_dicts.append(d)
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top_dicts, "text_offset": offsets}


def chat_logprobs(texts: TokenTexts, r: Req, start: int, end: int) -> dict:
    """OpenAI's chat log-probs of output tokens [start, end): `{"content": [{token, bytes, logprob,
    top_logprobs: [{token, bytes, logprob}]}]}`."""
    ids, lps, tops = _token_lists(r, start, end, prompt=False)
    tokens = texts.of(ids)
    top_texts = texts.of([t for top in tops if top is not None for t in top[1]])
    content, pos = [], 0
    for text, lp, top in zip(tokens, lps, tops, strict=True):
        alts = []
        if top is not None:
            for alt_lp, alt_text in zip(top[0], top_texts[pos : pos + len(top[1])], strict=True):
                alts.append({"token": alt_text, "bytes": list(alt_text.encode()), "logprob": alt_lp})
            pos += len(top[1])
        content.append({"token": text, "bytes": list(text.encode()), "logprob": lp, "top_logprobs": alts})
    return {"content": content}
