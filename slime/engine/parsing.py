"""Model text -> reasoning, visible text and tool calls, by chat-template family.

The names are SGLang's `--tool-call-parser` / `--reasoning-parser` values (given to a run as
`--sglang-tool-call-parser` / `--sglang-reasoning-parser`); the parsing is this module's own, so
it works without the `sglang` package. Two readers: the built-in engine's `/v1/chat/completions`
(its own `--tool-call-parser` / `--reasoning-parser`) and slime's agent adapters
(`slime.agent.adapters`, in front of any engine).

Tool-call formats:

* `qwen25`, `qwen`, `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (one
  block per call; Qwen2.5/Qwen3, Hermes, and the bundled tiny model's example template);
* `llama3`: `<|python_tag|>{"name": ..., "parameters": {...}}` or a bare JSON object; several calls
  separated by `;`;
* `mistral`: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.

Reasoning formats: `qwen3` (`<think>...</think>` when present), `deepseek-r1` (everything before
`</think>` is reasoning, the opening tag is optional: the template puts it in the prompt).

A call to a tool the request did not offer is left in the text; a call whose arguments are not
JSON is kept with `{"_raw_arguments": text}` and marks the output `ill_formed`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from slime.errors import SlimeError

TOOL_PARSERS = ("qwen25", "qwen", "hermes", "llama3", "mistral")
REASONING_PARSERS = ("qwen3", "deepseek-r1")


@dataclasses.dataclass(frozen=True)
class ParsedModelOutput:
    """Structured view of one decoded model output."""

    reasoning: str
    text: str
    tool_uses: list[dict[str, Any]]  # [{"name": str, "input": dict}]
    ill_formed: bool = False


def check_parser_names(
    tool_parser: str | None,
    reasoning_parser: str | None,
    *,
    tool_option: str = "tool_parser",
    reasoning_option: str = "reasoning_parser",
) -> None:
    """A clear error for a parser name this module does not know (before any request is served)."""
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise SlimeError(
            f"{tool_option} {tool_parser!r} is not a known tool-call parser; choose one of {', '.join(TOOL_PARSERS)}"
        )
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise SlimeError(
            f"{reasoning_option} {reasoning_parser!r} is not a known reasoning parser; "
            f"choose one of {', '.join(REASONING_PARSERS)}"
        )


def parse_model_output(
    raw_output: str,
    *,
    tools_schema: list[dict] | None,
    tool_parser_name: str | None,
    reasoning_parser_name: str | None,
    xml_fallback: bool = False,
) -> ParsedModelOutput:
    """Split raw model text (special tokens kept) into reasoning, visible text and tool calls."""
    reasoning, body = split_reasoning(raw_output, reasoning_parser_name)
    body, tool_uses, ill_formed = parse_tool_uses(body, tools_schema, tool_parser_name, xml_fallback=xml_fallback)
    if reasoning or tool_uses:  # the spacing around what was cut out is not part of the text
        body = body.strip()
    return ParsedModelOutput(reasoning=reasoning.strip(), text=body, tool_uses=tool_uses, ill_formed=ill_formed)


def split_reasoning(text: str, parser: str | None) -> tuple[str, str]:
    if parser is None:
        return "", text
    if parser == "qwen3":
        m = re.search(r"<think>(.*?)</think>", text, flags=re.DOTALL)
        if m is None:
            return "", text
        return m.group(1), text[: m.start()] + text[m.end() :]
    if parser == "deepseek-r1":
        head, sep, tail = text.partition("</think>")
        if not sep:
            return "", text
        return head.replace("<think>", "", 1), tail
    raise SlimeError(f"reasoning parser {parser!r} is not known; choose one of {', '.join(REASONING_PARSERS)}")


def _call_from_json(obj: Any, offered: set[str]) -> tuple[dict | None, bool]:
    """{"name", "arguments"|"parameters"} -> a tool use (None when not a call to an offered tool)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in offered:
        return None, False
    args = obj.get("arguments", obj.get("parameters", {}))
    ill = False
    if isinstance(args, str):  # some models emit the arguments JSON-encoded
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args, ill = {"_raw_arguments": args}, True
    if not isinstance(args, dict):
        args, ill = {"_raw_arguments": json.dumps(args)}, True
    return {"name": obj["name"], "input": args}, ill


def parse_tool_uses(
    body: str, tools_schema: list[dict] | None, tool_parser_name: str | None, *, xml_fallback: bool = False
) -> tuple[str, list[dict[str, Any]], bool]:
    """(text with the calls removed, tool uses, ill_formed). With `xml_fallback` (slime's agent
    parsing: models that sometimes write XML calls whatever their parser), XML-style calls
    (`parse_xml_tool_uses`) are read when the named format found none."""
    if not tools_schema:
        return body, [], False
    text, uses, ill_formed = (
        _parse_named(body, tools_schema, tool_parser_name) if tool_parser_name else (body, [], False)
    )
    if not uses and xml_fallback:
        text, uses = parse_xml_tool_uses(text, tools_schema)
    return text, uses, ill_formed


_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>]+)>(.*?)</function>\s*</tool_call>", flags=re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>]+)>(.*?)</parameter>", flags=re.DOTALL)


def parse_xml_tool_uses(body: str, tools_schema: list[dict]) -> tuple[str, list[dict[str, Any]]]:
    """Calls written `<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>`
    (Qwen3-Coder's and Anthropic-style text): (text with the calls removed, tool uses). Values stay
    strings, stripped; a call to a tool the request did not offer stays in the text."""
    offered = {(t.get("function") or {}).get("name") for t in tools_schema}
    uses: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for m in _XML_CALL.finditer(body):
        if m.group(1) not in offered:
            continue
        uses.append(
            {"name": m.group(1), "input": {p.group(1): p.group(2).strip() for p in _XML_PARAMETER.finditer(m.group(2))}}
        )
        kept.append(body[last : m.start()])
        last = m.end()
    kept.append(body[last:])
    return "".join(kept), uses


def _parse_named(body: str, tools_schema: list[dict], tool_parser_name: str) -> tuple[str, list[dict[str, Any]], bool]:
    offered = {name for t in tools_schema if isinstance(name := (t.get("function") or {}).get("name"), str)}
    uses: list[dict] = []
    ill_formed = False
    if tool_parser_name in ("qwen25", "qwen", "hermes"):
        kept: list[str] = []
        last = 0
        for m in re.finditer(r"<tool_call>\s*(.*?)\s*</tool_call>", body, flags=re.DOTALL):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError:
                ill_formed = True  # a malformed block stays in the text
                continue
            call, ill = _call_from_json(obj, offered)
            if call is None:
                continue
            uses.append(call)
            ill_formed |= ill
            kept.append(body[last : m.start()])
            last = m.end()
        kept.append(body[last:])
        return "".join(kept), uses, ill_formed
    if tool_parser_name == "llama3":
        text = body.strip()
        prefix = ""
        if "<|python_tag|>" in text:
            prefix, _, text = text.partition("<|python_tag|>")
        elif not text.startswith("{"):
            return body, [], False
        for part in (p for p in text.split(";") if p.strip()):
            try:
                obj = json.loads(part)
            except json.JSONDecodeError:
                return body, [], True
            call, ill = _call_from_json(obj, offered)
            if call is None:
                return body, [], False
            uses.append(call)
            ill_formed |= ill
        return prefix, uses, ill_formed
    if tool_parser_name == "mistral":
        prefix, sep, rest = body.partition("[TOOL_CALLS]")
        if not sep:
            return body, [], False
        try:
            objs = json.loads(rest.strip())
        except json.JSONDecodeError:
            return body, [], True
        for obj in objs if isinstance(objs, list) else [objs]:
            call, ill = _call_from_json(obj, offered)
            if call is not None:
                uses.append(call)
                ill_formed |= ill
        return (prefix, uses, ill_formed) if uses else (body, [], ill_formed)
    raise SlimeError(f"tool-call parser {tool_parser_name!r} is not known; choose one of {', '.join(TOOL_PARSERS)}")
