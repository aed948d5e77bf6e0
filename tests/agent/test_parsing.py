"""Tool-call and reasoning parsers on text (the tiny random model does not write tool calls on its
own; tests/agent/test_tool_conversation.py drives one through a real engine)."""

from __future__ import annotations

import pytest

from slime.agent import parsing as agent_parsing
from slime.engine.parsing import check_parser_names, parse_model_output
from slime.errors import SlimeError

TOOLS = [
    {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
]


def parse(text, tool=None, reasoning=None, tools=TOOLS):
    return parse_model_output(text, tools_schema=tools, tool_parser_name=tool, reasoning_parser_name=reasoning)


@pytest.mark.parametrize("name", ["qwen25", "qwen", "hermes"])
def test_hermes_style_blocks(name):
    out = parse(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n'
        '</tool_call>\n<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>',
        name,
    )
    assert out.tool_uses == [
        {"name": "calculator", "input": {"expression": "2+3"}},
        {"name": "search", "input": {"q": "x"}},
    ]
    assert out.text == "Let me compute." and not out.ill_formed


def test_unoffered_tool_and_bad_json_stay_in_text():
    text = '<tool_call>{"name": "rm", "arguments": {}}</tool_call> <tool_call>{not json}</tool_call>'
    out = parse(text, "qwen25")
    assert out.tool_uses == [] and out.text == text and out.ill_formed  # the malformed block is reported


def test_arguments_that_are_not_json_are_kept_raw():
    out = parse('<tool_call>{"name": "calculator", "arguments": "2+"}</tool_call>', "qwen25")
    assert out.tool_uses == [{"name": "calculator", "input": {"_raw_arguments": "2+"}}] and out.ill_formed


def test_no_parser_or_no_tools_means_plain_text():
    text = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    assert parse(text).tool_uses == [] and parse(text, "qwen25", tools=None).text == text


def test_llama3_and_mistral():
    out = parse(
        '<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+1"}};'
        '{"name": "search", "parameters": {"q": "y"}}',
        "llama3",
    )
    assert [u["name"] for u in out.tool_uses] == ["calculator", "search"] and out.text == ""
    assert parse("just words", "llama3").tool_uses == []
    out = parse('Sure [TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "4*5"}}]', "mistral")
    assert out.tool_uses == [{"name": "calculator", "input": {"expression": "4*5"}}] and out.text == "Sure"


def test_reasoning_parsers():
    out = parse("<think>add the ones</think>The answer is 5", reasoning="qwen3")
    assert (out.reasoning, out.text) == ("add the ones", "The answer is 5")
    assert parse("no thinking here", reasoning="qwen3").reasoning == ""
    # deepseek-r1: the template opened <think> in the prompt; the output holds only the closing tag
    out = parse(
        'carry the one</think><tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "qwen25", "deepseek-r1"
    )
    assert out.reasoning == "carry the one" and out.tool_uses == [{"name": "calculator", "input": {}}]


def test_unknown_parser_names_are_one_clear_error():
    with pytest.raises(SlimeError, match="'qwen9'.*qwen25"):
        check_parser_names("qwen9", None)
    with pytest.raises(SlimeError, match="--sglang-reasoning-parser 'o1'"):
        check_parser_names(None, "o1", reasoning_option="--sglang-reasoning-parser")


XML_CALL = (
    "Looking.\n<tool_call>\n<function=search>\n<parameter=q>\n red fox \n</parameter>\n"
    "<parameter=k>3</parameter>\n</function>\n</tool_call>"
)


def test_agent_parsing_reads_xml_calls_when_the_named_format_finds_none():
    """slime's agent path reads `<function=...><parameter=...>` calls (values stripped strings) as a
    fallback; the engine's /v1 parsing keeps to the named format."""
    out = agent_parsing.parse_model_output(
        XML_CALL, tools_schema=TOOLS, tool_parser_name="qwen25", reasoning_parser_name=None
    )
    assert out.tool_uses == [{"name": "search", "input": {"q": "red fox", "k": "3"}}] and out.text == "Looking."
    assert parse(XML_CALL, "qwen25").tool_uses == []  # the engine's own parsing
    text, uses, ill = agent_parsing.parse_tool_uses(XML_CALL.replace("search", "rm"), TOOLS, None)
    assert uses == [] and "<function=rm>" in text and not ill  # a tool not offered stays in the text
    # a JSON call found by the named parser wins; the XML one is then left as text
    both = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>' + XML_CALL
    out = agent_parsing.parse_model_output(
        both, tools_schema=TOOLS, tool_parser_name="qwen25", reasoning_parser_name=None
    )
    assert out.tool_uses == [{"name": "calculator", "input": {}}] and "<function=search>" in out.text
