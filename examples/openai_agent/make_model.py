"""The example's tiny model: `slime tiny-model`'s 0.8M-parameter shape, with the tool call's fixed
JSON boilerplate added to the tokenizer as two ordinary tokens (`CALL_TOKENS`), so a whole call
`<tool_call>{"name":"calculator","arguments":{"expression":"57+8"}}</tool_call>` is 6 tokens (the
two added ones plus the digits and the `+`) instead of ~65 byte-level ones. Nothing else differs
from `slime tiny-model --hidden-size 128 --num-layers 4 --num-heads 4 --num-kv-heads 2
--intermediate-size 384`; the model and the adapter see ordinary text.

Usage: python -m examples.openai_agent.make_model --out DIR
"""

from __future__ import annotations

import argparse

from examples.openai_agent.make_data import CALL_TOKENS
from slime.data.tiny_model import build_tiny_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = build_tiny_model(
        a.out,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        seed=a.seed,
        added_tokens=CALL_TOKENS,
    )
    print(f"wrote {out} (tokenizer + {len(CALL_TOKENS)} tool-call tokens)")


if __name__ == "__main__":
    main()
