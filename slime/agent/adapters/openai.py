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
    flatten_content,
    manager_finish_reason,
    sid_from_bearer,
    sid_from_body,
    tool_call_dict,
)
from slime.agent.parsing import ParsedModelOutput

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
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise AdapterError(400, "invalid_request_error", "messages must be a non-empty list", param="messages")
        tools = _tools(body.get("tools"))
        if body.get("tool_choice") == "none":
            tools = None
        return _translate_messages(messages), tools

    def _build_reply(self, parsed: ParsedModelOutput, raw_finish: str) -> Reply:
        wire, manager_message = _reply_messages(parsed)
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
                "usage": _usage(in_tok, out_tok),
            }
        )

    def _error(self, err: AdapterError) -> web.Response:
        kind = {429: "rate_limit_error"}.get(err.status, err.kind)
        return web.json_response(
            {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}, status=err.status
        )


def _arguments_dict(arguments: Any) -> dict:
    """OpenAI sends tool-call arguments JSON-encoded; templates (and replay matching) want a dict."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {"_raw_arguments": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}
    return {"_raw_arguments": str(arguments)}


def _translate_messages(messages: list) -> list[dict]:
    """OpenAI messages -> chat-template messages (wire-only ids dropped, arguments as dicts), in the
    same form `_reply_messages` records a reply in, so a replayed reply compares equal."""
    out: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise AdapterError(
                400, "invalid_request_error", f"messages[{i}] must be an object with a role", param=f"messages[{i}]"
            )
        role = msg["role"]
        if role == "developer":
            role = "system"
        if role in ("system", "user", "tool"):
            out.append({"role": role, "content": flatten_content(msg.get("content"))})
        elif role == "assistant":
            m: dict[str, Any] = {"role": "assistant", "content": flatten_content(msg.get("content"))}
            if msg.get("reasoning_content"):
                m["reasoning_content"] = msg["reasoning_content"]
            calls = [
                tool_call_dict(
                    (c.get("function") or {}).get("name") or "tool",
                    _arguments_dict((c.get("function") or {}).get("arguments")),
                )
                for c in msg.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            if calls:
                m["tool_calls"] = calls
            out.append(m)
        else:
            raise AdapterError(
                400,
                "invalid_request_error",
                f"messages[{i}].role {role!r} is not supported",
                param=f"messages[{i}].role",
            )
    return out


def _tools(tools: Any) -> list[dict] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise AdapterError(400, "invalid_request_error", "tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            raise AdapterError(
                400,
                "invalid_request_error",
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                param=f"tools[{i}]",
            )
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
                },
            }
        )
    return out


def _reply_messages(parsed: ParsedModelOutput) -> tuple[dict, dict]:
    """(the wire message, the message recorded in the trajectory)."""
    calls = [(f"call_{secrets.token_hex(12)}", tu["name"], tu.get("input") or {}) for tu in parsed.tool_uses]
    wire: dict[str, Any] = {"role": "assistant", "content": None if calls and not parsed.text else parsed.text}
    manager: dict[str, Any] = {"role": "assistant", "content": parsed.text}
    if parsed.reasoning:
        wire["reasoning_content"] = parsed.reasoning
        manager["reasoning_content"] = parsed.reasoning
    if calls:
        wire["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for cid, name, args in calls
        ]
        manager["tool_calls"] = [tool_call_dict(name, args) for _, name, args in calls]
    return wire, manager


def _usage(in_tok: int, out_tok: int) -> dict:
    return {"prompt_tokens": in_tok, "completion_tokens": out_tok, "total_tokens": in_tok + out_tok}


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
        await emit(None, usage=_usage(in_tok, out_tok))
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out
