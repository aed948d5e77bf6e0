"""The example's data: the bundled addition task (`train.jsonl`, `eval.jsonl`: `{"prompt": "57+8=",
"label": "65"}`) plus `sft_tools.jsonl`, a short warm start that shows the model the tool-call
format once per problem:

    user: 57+8=
    assistant: <tool_call>{"name":"calculator","arguments":{"expression":"57+8"}}</tool_call>
    tool: 65
    assistant: \\boxed{65}

Usage: python -m examples.openai_agent.make_data --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slime.data.arithmetic import write_arithmetic_dataset


def tool_call_text(expression: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return "<tool_call>" + json.dumps(call, separators=(",", ":")) + "</tool_call>"


# the call's fixed text before and after the expression: one token each in the example's model
CALL_TOKENS = tuple(tool_call_text("@").split("@"))


def write(out: Path, difficulty: int = 2, seed: int = 0) -> None:
    paths = write_arithmetic_dataset(out, difficulty=difficulty, seed=seed)
    rows = [json.loads(line) for line in Path(paths["train"]).read_text().splitlines()]
    with (out / "sft_tools.jsonl").open("w") as f:
        for row in rows:
            expression = row["prompt"].rstrip("=")
            messages = [
                {"role": "user", "content": row["prompt"]},
                {"role": "assistant", "content": tool_call_text(expression)},
                {"role": "tool", "content": row["label"]},
                {"role": "assistant", "content": "\\boxed{" + row["label"] + "}"},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--difficulty", type=int, default=2)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    write(a.out, a.difficulty)
    print(f"wrote {a.out}/train.jsonl, eval.jsonl, sft_tools.jsonl")
