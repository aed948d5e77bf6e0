"""A calculator-tool agent written only with the official `openai` package (and the standard
library). Nothing in it knows about training: point it at any OpenAI-compatible server and it runs.

slime-rl calls `run(base_url, api_key, sample)` once per sample (`--agent-function-path
examples.openai_agent.agent.run`); `base_url` is the run's adapter, `api_key` the session id.
"""

from __future__ import annotations

import ast
import json
import operator
import re

import openai

MAX_TURNS = 3
# partial credit, so a barely trained model gets a signal: a wrong answer that repeats the
# calculator's result, else at least one call the calculator could evaluate
REPEATED_TOOL = 0.25
WELL_FORMED_CALL = 0.1
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(arguments: str) -> str:
    """The tool: evaluate `{"expression": "57+8"}` safely (numbers and + - * / only)."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    try:
        value = ev(ast.parse(str(json.loads(arguments)["expression"]), mode="eval").body)
    except Exception as e:  # the model's mistake: the tool says so, as a real tool would
        return f"error: {type(e).__name__}"
    return str(int(value)) if float(value).is_integer() else str(value)


def answer_of(text: str | None) -> str | None:
    m = re.findall(r"\\boxed\{([^}]*)\}", text or "")
    return m[-1].strip() if m else None


def question_of(sample) -> str:
    prompt = sample.prompt
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


async def run(base_url: str, api_key: str, sample) -> float:
    """Ask, call the calculator as often as the model wants (up to MAX_TURNS model turns), and
    grade the final `\\boxed{}` answer: 1.0 when it equals the label; partial credit 0.25 when it
    is wrong but repeats what the calculator last said, else 0.1 when the calculator evaluated at
    least one of its calls; else 0.0."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": question_of(sample)}]
        tool_said, tool_ran = None, False
        for _ in range(MAX_TURNS):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                answer = answer_of(message.content)
                if answer == str(sample.label):
                    return 1.0
                if answer is not None and answer == tool_said:
                    return REPEATED_TOOL
                return WELL_FORMED_CALL if tool_ran else 0.0
            for call in message.tool_calls:
                tool_said = calculator(call.function.arguments)
                tool_ran = tool_ran or not tool_said.startswith("error")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_said})
    return WELL_FORMED_CALL if tool_ran else 0.0
