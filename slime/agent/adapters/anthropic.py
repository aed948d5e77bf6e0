"""Anthropic Messages in front of the engines: `/v1/messages` (streaming or not, `system`, `tools`,
`tool_use` / `tool_result` blocks, `thinking` blocks, `max_tokens`, `stop_sequences`, `temperature`,
`top_p`, `top_k`) and `/v1/messages/count_tokens`.

The session id is the agent's API key: `Authorization: Bearer <sid>` (the SDK's `auth_token`),
else `X-Api-Key` (the SDK's `api_key`), else `"default"`. Errors use Anthropic's shape
`{"type": "error", "error": {"type", "message"}}`.

A `system` message in the middle of the list (some clients send reminders that way; most chat
templates accept a system message only first) is folded into the user message before it (else the
one after it) as a `<system-reminder>` text block.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from aiohttp import web

from slime.agent.adapters.common import (
    AdapterError,
    BaseAdapter,
    Reply,
    _json_body,
    flatten_content,
    manager_finish_reason,
    sid_from_bearer,
    tool_call_dict,
)
from slime.engine.chat import function_tool
from slime.engine.parsing import ParsedModelOutput

logger = logging.getLogger(__name__)


class AnthropicAdapter(BaseAdapter):
    logger = logger
    log_prefix = "anthropic_adapter"
    max_token_keys = ("max_tokens",)
    stop_keys = ("stop_sequences",)

    def _register_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._run_turn)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)

    def _session_id(self, request: web.Request, body: dict) -> str:
        return sid_from_bearer(request) or (request.headers.get("X-Api-Key") or "").strip() or "default"

    def _preprocess_body(self, body: dict) -> None:
        _fold_mid_list_system(body)

    def _translate(self, body: dict) -> tuple[list[dict], list[dict] | None]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise AdapterError(400, "invalid_request_error", "messages: must be a non-empty list")
        tools = _tools(body.get("tools"))
        if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") == "none":
            tools = None
        return _translate_messages(messages, body.get("system")), tools

    def _build_reply(self, parsed: ParsedModelOutput, raw_finish: str) -> Reply:
        blocks: list[dict] = []
        if parsed.reasoning:
            blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        if parsed.text or not parsed.tool_uses:
            blocks.append({"type": "text", "text": parsed.text})
        for tu in parsed.tool_uses:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{secrets.token_hex(12)}",
                    "name": tu["name"],
                    "input": tu.get("input") or {},
                }
            )
        stop = "tool_use" if parsed.tool_uses else ("max_tokens" if raw_finish == "length" else "end_turn")
        manager: dict[str, Any] = {"role": "assistant", "content": parsed.text}
        if parsed.reasoning:
            manager["reasoning_content"] = parsed.reasoning
        if parsed.tool_uses:
            manager["tool_calls"] = [tool_call_dict(tu["name"], tu.get("input")) for tu in parsed.tool_uses]
        return Reply(
            manager_message=manager,
            finish_reason=manager_finish_reason(parsed.tool_uses, raw_finish),
            wire=(blocks, stop),
        )

    async def _respond(self, request, body, reply, in_tok, out_tok, stream) -> web.StreamResponse:
        blocks, stop = reply.wire
        model = body.get("model") or self.served_model_name
        msg = {
            "id": f"msg_{secrets.token_hex(12)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": in_tok, "output_tokens": out_tok},
        }
        if stream:
            return await _stream(request, msg)
        return web.json_response(msg)

    def _error(self, err: AdapterError) -> web.Response:
        return web.json_response(
            {"type": "error", "error": {"type": err.kind, "message": err.message}}, status=err.status
        )

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """The prompt's length under the served chat template (no session, nothing recorded)."""
        try:
            body = await _json_body(request)
            _fold_mid_list_system(body)
            messages, tools = self._translate(body)
            n = len(self._encode(self._render_text(messages, tools, True)))
        except AdapterError as e:
            return self._error(e)
        return web.json_response({"input_tokens": n})


def _translate_messages(messages: list, system: Any) -> list[dict]:
    """Anthropic messages (+ system) -> chat-template messages: `tool_result` blocks become `tool`
    messages, `tool_use` blocks the assistant's `tool_calls` (ids dropped), `thinking` blocks its
    `reasoning_content`."""
    out: list[dict] = []
    if system:
        out.append({"role": "system", "content": flatten_content(system)})
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise AdapterError(
                400, "invalid_request_error", f"messages.{i}: must be an object with role 'user' or 'assistant'"
            )
        role, content = m["role"], m.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": flatten_content(content)}]
        if role == "system":
            out.append({"role": "system", "content": flatten_content(content)})
        elif role == "user":
            texts: list[str] = []
            for b in blocks:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    if texts:
                        out.append({"role": "user", "content": "\n".join(texts)})
                        texts = []
                    out.append({"role": "tool", "content": flatten_content(b.get("content"))})
                else:
                    texts.append(flatten_content([b]))
            if texts:
                out.append({"role": "user", "content": "\n".join(t for t in texts if t)})
        else:
            text, thinking, calls = [], [], []
            for b in blocks:
                if not isinstance(b, dict):
                    continue
                if b.get("type") == "text":
                    text.append(b.get("text") or "")
                elif b.get("type") == "thinking":
                    thinking.append(b.get("thinking") or "")
                elif b.get("type") == "tool_use":
                    calls.append(tool_call_dict(b.get("name") or "tool", b.get("input")))
            mo: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if thinking:
                mo["reasoning_content"] = "".join(thinking)
            if calls:
                mo["tool_calls"] = calls
            out.append(mo)
    return out


def _tools(tools: Any) -> list[dict] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise AdapterError(400, "invalid_request_error", "tools: must be a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not t.get("name"):
            raise AdapterError(400, "invalid_request_error", f"tools.{i}.name: Field required")
        out.append(function_tool(t["name"], t.get("description", ""), t.get("input_schema")))
    return out


async def _stream(request: web.Request, msg: dict) -> web.StreamResponse:
    """Messages server-sent events: message_start, per block content_block_start / _delta / _stop,
    message_delta (stop reason, usage), message_stop."""
    out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)

    async def event(name: str, data: dict) -> None:
        await out.write(f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode())

    start = {
        **msg,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 0},
    }
    await event("message_start", {"message": start})
    for i, b in enumerate(msg["content"]):
        if b["type"] == "thinking":
            first, delta = (
                {"type": "thinking", "thinking": "", "signature": ""},
                {"type": "thinking_delta", "thinking": b["thinking"]},
            )
        elif b["type"] == "text":
            first, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": b["text"]}
        else:
            first = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"], ensure_ascii=False)}
        await event("content_block_start", {"index": i, "content_block": first})
        await event("content_block_delta", {"index": i, "delta": delta})
        await event("content_block_stop", {"index": i})
    await event(
        "message_delta",
        {
            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": msg["usage"]["output_tokens"]},
        },
    )
    await event("message_stop", {})
    await out.write_eof()
    return out


_WRAP = ("<system-reminder>\n", "\n</system-reminder>\n")


def _fold_mid_list_system(body: dict) -> None:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return
    out: list = []
    pending: list[dict] = []  # reminders with no user message before them yet
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and m.get("role") == "system" and i > 0:
            block = {"type": "text", "text": _WRAP[0] + flatten_content(m.get("content")) + _WRAP[1]}
            target = next((x for x in reversed(out) if isinstance(x, dict) and x.get("role") == "user"), None)
            if target is None:
                pending.append(block)
            else:
                _as_blocks(target).append(block)
            continue
        if pending and isinstance(m, dict) and m.get("role") == "user":
            m = dict(m)
            m["content"] = pending + _as_blocks(m)
            pending = []
        out.append(m)
    if pending:
        out.append({"role": "user", "content": pending})
    body["messages"] = out


def _as_blocks(msg: dict) -> list:
    c = msg.get("content")
    if not isinstance(c, list):
        msg["content"] = [{"type": "text", "text": c if isinstance(c, str) else ""}]
    return msg["content"]
