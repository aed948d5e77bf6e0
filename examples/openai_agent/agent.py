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
# partial credit, so a half-trained model gets a signal it cannot game: a wrong (or missing) final
# answer after a call whose expression is the problem's own (operands copied; then the calculator
# said the right answer). Any other call earns nothing: no credit for merely well-formed calls.
COPIED_CALL = 0.25
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


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
    # the model's mistake (not JSON, no "expression", not arithmetic, 1/0, nested too deep): the
    # tool says so, as a real tool would
    except (ValueError, KeyError, TypeError, SyntaxError, ArithmeticError, RecursionError) as e:
        return f"error: {type(e).__name__}"
    return str(int(value)) if float(value).is_integer() else str(value)


def answer_of(text: str | None) -> str | None:
    m = re.findall(r"\\boxed\{([^}]*)\}", text or "")
    return m[-1].strip() if m else None


def question_of(sample) -> str:
    prompt = sample.prompt
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def expression_of(arguments: str) -> str | None:
    """The call's expression without spaces (None when the arguments are not `{"expression": ...}`)."""
    try:
        return "".join(str(json.loads(arguments)["expression"]).split())
    except (ValueError, KeyError, TypeError, RecursionError):  # not JSON, or not an object with "expression"
        return None


async def run(base_url: str, api_key: str, sample) -> float:
    """Ask, call the calculator as often as the model wants (up to MAX_TURNS model turns), and
    grade the final `\\boxed{}` answer: 1.0 when it equals the label; else partial credit
    COPIED_CALL (0.25) when one of its calls was the problem itself (e.g. `57+8` for `57+8=`);
    else 0.0."""
    question = question_of(sample)
    problem = "".join(question.split()).rstrip("=")
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": question}]
        copied = False
        for _ in range(MAX_TURNS):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                if answer_of(message.content) == str(sample.label):
                    return 1.0
                return COPIED_CALL if copied else 0.0
            for call in message.tool_calls:
                copied = copied or expression_of(call.function.arguments) == problem
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)}
                )
    return COPIED_CALL if copied else 0.0
