"""OpenAI Chat Completions in front of the engines: `/v1/chat/completions` (streaming or not,
`tools` / `tool_choice`, `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop`,
`seed`) and `/v1/models`.

The session id is the agent's API key (`Authorization: Bearer <sid>`), else the body's
`metadata.session_id`, else `user`, else `"default"`. Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`, so the official client raises its own
exceptions (`BadRequestError`, `RateLimitError`, ...).

`tool_choice`: `"none"` offers the model no tools (it cannot call one); any other value offers the
request's tools and lets the model decide (the engine does not constrain decoding).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

from aiohttp import web

from slime.agent.adapters.common import (
    AdapterError,
    BaseAdapter,
    Reply,
    manager_finish_reason,
    sid_from_bearer,
    sid_from_body,
)
from slime.engine.chat import MessageError, chat_messages, function_tools, reply_messages, usage
from slime.engine.parsing import ParsedModelOutput

logger = logging.getLogger(__name__)


class OpenAIAdapter(BaseAdapter):
    logger = logger
    log_prefix = "openai_adapter"
    max_token_keys = ("max_completion_tokens", "max_tokens")
    stop_keys = ("stop",)

    def _register_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._run_turn)

    def _session_id(self, request: web.Request, body: dict) -> str:
        return sid_from_bearer(request) or sid_from_body(body) or "default"

    def _translate(self, body: dict) -> tuple[list[dict], list[dict] | None]:
        try:
            messages = chat_messages(body.get("messages"))
            tools = function_tools(body.get("tools"))
        except MessageError as e:
            raise AdapterError(400, "invalid_request_error", str(e), param=e.param) from None
        if body.get("tool_choice") == "none":
            tools = None
        return messages, tools

    def _build_reply(self, parsed: ParsedModelOutput, raw_finish: str) -> Reply:
        wire, manager_message = reply_messages(parsed)
        finish = "tool_calls" if parsed.tool_uses else ("length" if raw_finish == "length" else "stop")
        return Reply(
            manager_message=manager_message,
            finish_reason=manager_finish_reason(parsed.tool_uses, raw_finish),
            wire=(wire, finish),
        )

    async def _respond(self, request, body, reply, in_tok, out_tok, stream) -> web.StreamResponse:
        wire, finish = reply.wire
        model = body.get("model") or self.served_model_name
        if stream:
            return await _stream(request, model, wire, finish, in_tok, out_tok, body)
        return web.json_response(
            {
                "id": f"chatcmpl-{secrets.token_hex(12)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": wire, "finish_reason": finish, "logprobs": None}],
                "usage": usage(in_tok, out_tok),
            }
        )

    def _error(self, err: AdapterError) -> web.Response:
        kind = {429: "rate_limit_error"}.get(err.status, err.kind)
        return web.json_response(
            {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}, status=err.status
        )


async def _stream(request, model, wire, finish, in_tok, out_tok, body) -> web.StreamResponse:
    """Chat Completions server-sent events. The engine answers a turn whole, so the deltas are:
    the role, the reasoning, the content, the tool calls (each whole), then the finish reason (and
    usage when `stream_options.include_usage`), then `[DONE]`."""
    out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    cid, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())

    async def emit(delta: dict | None, finish_reason: str | None = None, usage: dict | None = None) -> None:
        chunk: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        if usage is not None:
            chunk["usage"] = usage
        await out.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())

    await emit({"role": "assistant", "content": ""})
    if wire.get("reasoning_content"):
        await emit({"reasoning_content": wire["reasoning_content"]})
    if wire.get("content"):
        await emit({"content": wire["content"]})
    if wire.get("tool_calls"):
        await emit({"tool_calls": [{**c, "index": i} for i, c in enumerate(wire["tool_calls"])]})
    await emit({}, finish_reason=finish)
    if (body.get("stream_options") or {}).get("include_usage"):
        await emit(None, usage=usage(in_tok, out_tok))
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out
