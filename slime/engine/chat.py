"""OpenAI Chat Completions messages <-> the model's chat template, shared by the built-in engine's
`/v1/chat/completions` (`slime.engine.openai_api`) and slime's agent adapters (`slime.agent.adapters`,
which import it from here: the engine imports nothing from slime.agent).

* `chat_messages(messages)`: OpenAI messages as chat-template messages (content blocks flattened
  to text, `developer` as `system`, tool-call arguments as dicts, wire-only ids dropped);
  `function_tools(tools)`: the request's tools in the `{"type": "function", "function": ...}`
  form templates take. Both raise `MessageError` naming the field at fault.
* `render_chat(...)`: the prompt text, `tokenizer.apply_chat_template` with the tools.
* `reply_messages(parsed)`: a parsed model output as the wire message (JSON-encoded arguments,
  call ids) and as the message a template renders back.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from slime.engine.parsing import ParsedModelOutput


class MessageError(ValueError):
    """A malformed message or tool; `param` names the field (e.g. `messages[2].role`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def flatten_content(c: Any) -> str:
    """A wire content value (string, or a list of OpenAI / Anthropic blocks) as template text."""
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        return str(c)
    parts: list[str] = []
    for b in c:
        if isinstance(b, str):
            parts.append(b)
        elif not isinstance(b, dict):
            parts.append(str(b))
        elif b.get("type") in ("text", "input_text", "output_text"):
            parts.append(b.get("text") or "")
        elif b.get("type") in ("image", "image_url", "input_image"):
            parts.append("[image omitted]")
        elif "content" in b:
            parts.append(flatten_content(b.get("content")))
        elif "text" in b:
            parts.append(str(b.get("text") or ""))
    return "\n".join(p for p in parts if p)


def tool_call_dict(name: str, arguments: dict | None) -> dict:
    """The tool call as stored in chat-template messages: arguments a dict, no wire id (so a
    reply and its replay by the agent compare equal)."""
    return {"type": "function", "function": {"name": name, "arguments": arguments or {}}}


def arguments_dict(arguments: Any) -> dict:
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


def chat_messages(messages: Any) -> list[dict]:
    """OpenAI messages -> chat-template messages (wire-only ids dropped, arguments as dicts), in the
    same form `reply_messages` records a reply in, so a replayed reply compares equal."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list", "messages")
    out: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise MessageError(f"messages[{i}] must be an object with a role", f"messages[{i}]")
        role = msg["role"]
        if role == "developer":
            role = "system"
        if role in ("system", "user", "tool"):
            out.append({"role": role, "content": flatten_content(msg.get("content"))})
        elif role == "assistant":
            out.append(_assistant_message(msg))
        else:
            raise MessageError(f"messages[{i}].role {role!r} is not supported", f"messages[{i}].role")
    return out


def _assistant_message(msg: dict) -> dict:
    m: dict[str, Any] = {"role": "assistant", "content": flatten_content(msg.get("content"))}
    if msg.get("reasoning_content"):
        m["reasoning_content"] = msg["reasoning_content"]
    calls = [
        tool_call_dict(
            (c.get("function") or {}).get("name") or "tool",
            arguments_dict((c.get("function") or {}).get("arguments")),
        )
        for c in msg.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    if calls:
        m["tool_calls"] = calls
    return m


def function_tools(tools: Any) -> list[dict] | None:
    """The request's tools as templates take them (None when there are none)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise MessageError("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            raise MessageError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                f"tools[{i}]",
            )
        out.append(function_tool(fn["name"], fn.get("description", ""), fn.get("parameters")))
    return out


def function_tool(name: str, description: str, parameters: dict | None) -> dict:
    """One tool in the form chat templates take (an empty object schema when it has none)."""
    schema = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def render_chat(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    template_kwargs: dict | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """The prompt text of chat-template messages (`tools` passed to the template when given)."""
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    if continue_final_message:  # only when asked: older tokenizers do not know the argument
        kwargs["continue_final_message"] = True
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def reply_messages(parsed: ParsedModelOutput) -> tuple[dict, dict]:
    """(the wire message, the message as a chat template renders it back)."""
    calls = [(f"call_{secrets.token_hex(12)}", tu["name"], tu.get("input") or {}) for tu in parsed.tool_uses]
    wire: dict[str, Any] = {"role": "assistant", "content": None if calls and not parsed.text else parsed.text}
    template: dict[str, Any] = {"role": "assistant", "content": parsed.text}
    if parsed.reasoning:
        wire["reasoning_content"] = parsed.reasoning
        template["reasoning_content"] = parsed.reasoning
    if calls:
        wire["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for cid, name, args in calls
        ]
        template["tool_calls"] = [tool_call_dict(name, args) for _, name, args in calls]
    return wire, template


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
