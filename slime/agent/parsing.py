"""slime's `slime.agent.parsing`: model text -> reasoning, visible text and tool calls, for agents.

The parsers live in `slime.engine.parsing`, shared with the built-in engine's
`/v1/chat/completions`. Agent code differs in one way, as in slime: when the named tool-call
format finds no call, XML-style calls are read too (coding-agent models write them now and then
whatever their template says), so the agent adapters parse through this module.
"""

from __future__ import annotations

from typing import Any

from slime.engine import parsing
from slime.engine.parsing import ParsedModelOutput, parse_xml_tool_uses

__all__ = ["ParsedModelOutput", "parse_model_output", "parse_tool_uses", "parse_xml_tool_uses"]


def parse_model_output(
    raw_output: str, *, tools_schema: list[dict] | None, tool_parser_name: str | None, reasoning_parser_name: str | None
) -> ParsedModelOutput:
    return parsing.parse_model_output(
        raw_output,
        tools_schema=tools_schema,
        tool_parser_name=tool_parser_name,
        reasoning_parser_name=reasoning_parser_name,
        xml_fallback=True,
    )


def parse_tool_uses(
    body_text: str, tools_schema: list[dict] | None, tool_parser_name: str | None
) -> tuple[str, list[dict[str, Any]], bool]:
    return parsing.parse_tool_uses(body_text, tools_schema, tool_parser_name, xml_fallback=True)
