"""`stream: true`: the chunks of /v1/completions and /v1/chat/completions as the scheduler decodes.

The worker thread calls each streaming `Req`'s `on_token` after every token it appends; that
wakes the event loop (once per loop turn however many tokens came: `Wakeup`), which reads the
requests' outputs and sends what is new. What a chunk may carry is held back until it is sure to
be in the final text: an unfinished UTF-8 character, a stop token the answer drops, and any text
from where a stop string starts or could still start. At the end each choice sends the rest of
its final text (the same text as without streaming), so the chunks join to the non-streaming
answer. A chat request whose output is parsed (tool calls, reasoning) sends its message whole at
the end: a tool call is only known once complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from slime.engine.openai_api.protocol import Plan
from slime.engine.openai_api.responses import (
    TokenTexts,
    chat_logprobs,
    chat_message,
    envelope,
    finish_of,
    legacy_logprobs,
    new_id,
    prompt_text,
    usage_of,
)
from slime.engine.request import Req
from slime.engine.state import EngineState

logger = logging.getLogger(__name__)


class Wakeup:
    """An event the worker thread sets with one `call_soon_threadsafe` per loop turn, not per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._event = asyncio.Event()
        self._armed = True

    def notify(self) -> None:
        """Any thread (the worker's, between decode steps: it must never raise there)."""
        if self._armed:
            self._armed = False
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is shutting down
                self._loop.call_soon_threadsafe(self._event.set)

    def set(self) -> None:
        """The loop's thread."""
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event.clear()
        self._armed = True  # re-armed before the caller reads: a token appended from here on notifies


@dataclass
class Detokenized:
    """A request's output decoded so far, incrementally: each step decodes a window of a few
    tokens, not the whole output (vLLM's prefix / read offsets: the window starts a token early,
    so a tokenizer that spells a token differently at the start of a text still decodes right)."""

    text: str = ""  # the text of ids[:read]
    prefix: int = 0
    read: int = 0

    def extend(self, ids: list[int], tokenizer, skip_special_tokens: bool) -> None:
        if len(ids) <= self.read:
            return
        before = tokenizer.decode(ids[self.prefix : self.read], skip_special_tokens=skip_special_tokens)
        window = tokenizer.decode(ids[self.prefix :], skip_special_tokens=skip_special_tokens)
        if window.endswith("\ufffd") or not window.startswith(before):
            return  # a character whose bytes are not all decoded yet: wait for the next token
        self.text += window[len(before) :]
        self.prefix, self.read = self.read, len(ids)


@dataclass
class Sent:
    """How much of one choice the stream has sent."""

    text: str = ""
    tokens: int = 0
    offset: int = 0  # completions' log-probs: the next token's text_offset
    decoded: Detokenized = field(default_factory=Detokenized)


def streamable_text(r: Req, tokenizer, decoded: Detokenized | None = None) -> tuple[str, int]:
    """(the text of `r`'s output so far that the final text is sure to start with, the number of
    output tokens read), decoding on from `decoded`. Read while the worker appends: ids are
    appended after their log-probs."""
    decoded = decoded if decoded is not None else Detokenized()
    n = len(r.output_ids)
    ids = r.output_ids[:n]
    p = r.params
    if ids and ids[-1] in r.stop_ids and not p.no_stop_trim:
        ids = ids[:-1]  # may be the matched stop token, which the answer drops
    decoded.extend(ids, tokenizer, p.skip_special_tokens)
    text = decoded.text
    if p.stop and not p.no_stop_trim:
        cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=len(text))
        held = max(len(s) for s in p.stop) - 1  # the start of a stop string the next token may complete
        text = text[: max(0, min(cut, len(text) - held))]
    return text, n


class ChunkStream:
    """The chunks of one streaming request. `start()` submits it (QueueFull before anything is
    sent); `chunks()` yields the chunk objects, and aborts what is still running when it stops
    early (the client left)."""

    def __init__(self, state: EngineState, plan: Plan):
        self.state, self.plan = state, plan
        self.tokenizer = state.runner.tokenizer
        self.texts = TokenTexts(self.tokenizer)
        self.rid, self.created = new_id(plan), int(time.time())
        self.sent = [Sent() for _ in plan.reqs]
        self.wake: Wakeup | None = None

    def start(self) -> None:
        self.wake = Wakeup(asyncio.get_running_loop())
        for r in self.plan.reqs:
            r.on_token = self.wake.notify
        self.state.submit(self.plan.reqs)
        for r in self.plan.reqs:
            r.future.add_done_callback(self._finished)

    def _finished(self, fut: asyncio.Future) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieved: raised again where the stream reads the result
        assert self.wake is not None
        self.wake.set()

    async def chunks(self) -> AsyncGenerator[dict, None]:
        assert self.wake is not None, "start() first"
        reqs, results = self.plan.reqs, {}
        try:
            for i in range(len(reqs)):
                opening = self._opening(i)
                if opening is not None:
                    yield opening
            running = set(range(len(reqs)))
            while running:
                await self.wake.wait()
                for i in sorted(running):
                    if reqs[i].future.done():
                        results[i] = result = reqs[i].future.result()  # an engine failure raises here
                        running.discard(i)
                        for closing in self._closing(i, result):
                            yield closing
                    elif (progress := self._progress(i)) is not None:
                        yield progress
            if self.plan.include_usage:
                body = envelope(self.plan, self.rid, self.created, [], chunk=True)
                body["usage"] = usage_of(self.plan, [results[i] for i in range(len(reqs))])
                yield body
        finally:
            left = [r.rid for r in reqs if not r.future.done()]
            if left:
                self.state.scheduler.abort(rids=left)
            for r in reqs:
                r.on_token = None

    # ---------------------------------------------------------------- chunk shapes
    def _chunk(self, choice: dict) -> dict:
        return envelope(self.plan, self.rid, self.created, [choice], chunk=True)

    def _opening(self, i: int) -> dict | None:
        """Chat: the role. Completions with echo: the prompt (and its log-probs)."""
        if self.plan.kind == "chat":
            return self._chunk(
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            )
        if not self.plan.echo:
            return None
        text = prompt_text(self.plan, i, self.tokenizer)
        logprobs = None
        if self.plan.logprobs is not None:
            logprobs = self._logprobs(i, 0, 0, prompt=True)
        return self._chunk({"index": i, "text": text, "logprobs": logprobs, "finish_reason": None})

    def _progress(self, i: int) -> dict | None:
        if self.plan.kind == "chat" and self.plan.parses_output:
            return None  # sent whole at the end
        r, sent = self.plan.reqs[i], self.sent[i]
        text, n = streamable_text(r, self.tokenizer, sent.decoded)
        delta = text[len(sent.text) :] if text.startswith(sent.text) else ""
        if not delta and (self.plan.logprobs is None or n == sent.tokens):
            return None
        chunk = self._delta(i, delta, sent.tokens, n, None)
        sent.text, sent.tokens = sent.text + delta, n
        return chunk

    def _closing(self, i: int, result: dict) -> list[dict]:
        r, sent = self.plan.reqs[i], self.sent[i]
        reason, matched = finish_of(result)
        final = result["text"]
        if self.plan.kind == "chat" and self.plan.parses_output:
            message, called = chat_message(self.plan, final)
            delta = {k: v for k, v in message.items() if k != "role" and v is not None}
            logprobs = self._logprobs(i, 0, len(r.output_ids))
            body = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": None}
            finish = {"index": i, "delta": {}, "logprobs": None, "finish_reason": "tool_calls" if called else reason}
            finish["matched_stop"] = matched
            return [self._chunk(body), self._chunk(finish)]
        if not final.startswith(sent.text):  # cannot happen with a tokenizer whose decode extends
            logger.warning("stream of %s: sent text is not a prefix of the final text", r.rid)
        rest = final[len(sent.text) :] if final.startswith(sent.text) else ""
        if self.plan.kind == "completion":
            return [self._delta(i, rest, sent.tokens, len(r.output_ids), (reason, matched))]
        out = []
        if rest or (self.plan.logprobs is not None and sent.tokens < len(r.output_ids)):
            out.append(self._delta(i, rest, sent.tokens, len(r.output_ids), None))
        finish = {"index": i, "delta": {}, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
        return [*out, self._chunk(finish)]

    def _delta(self, i: int, text: str, start: int, end: int, finish: tuple | None) -> dict:
        """A chunk of new text and the log-probs of output tokens [start, end)."""
        logprobs = self._logprobs(i, start, end)
        if self.plan.kind == "completion":
            choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": None}
        else:
            choice = {"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        if finish is not None:
            choice["finish_reason"], choice["matched_stop"] = finish
        return self._chunk(choice)

    def _logprobs(self, i: int, start: int, end: int, prompt: bool = False) -> dict | None:
        """Log-probs of choice i's output tokens [start, end) (the prompt's alone, with `prompt`)."""
        if self.plan.logprobs is None:
            return None
        r = self.plan.reqs[i]
        if self.plan.kind == "chat":
            return chat_logprobs(self.texts, r, start, end)
        sent = self.sent[i]
        if (
            start == 0 and not prompt and not self.plan.echo
        ):  # offsets count from the prompt's end, as without streaming
            sent.offset = len(prompt_text(self.plan, i, self.tokenizer))
        lp = legacy_logprobs(self.texts, r, start, end, sent.offset, prompt=prompt)
        if lp["tokens"]:
            sent.offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
        return lp
