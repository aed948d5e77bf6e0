"""A real tool conversation through a real engine: the tiny model is first fine-tuned here (a few
hundred steps on one scripted conversation) until greedy decoding writes a `<tool_call>` block and
then the boxed answer, so the tool call really comes out of the engine and goes through the
`qwen25` parser, the official clients' tool-call objects, the tool result, and back. Then: the
whole conversation is one sample whose loss mask is exactly 1 on the model's tokens and 0 on the
tool result and template glue."""

from __future__ import annotations

import asyncio
import json
import shutil

import anthropic
import openai
import pytest
import torch
from conftest import ENGINE_KEY, reference_logprobs, serve, start_engine

from slime.utils.types import Sample

# an engine server of the scripted model
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def scripted_model(tiny_model_dir, tmp_path_factory):
    """The tiny model, fine-tuned to answer `2+3=` with CALL, then `\\boxed{5}` after the result."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("scripted_model")
    for f in tiny_model_dir.iterdir():
        shutil.copy(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt = enc(tok, "<|user|>2+3=<|end|><|assistant|>")
    first = enc(tok, CALL + "<|end|>")
    glue = enc(tok, "<|tool|>5<|end|><|assistant|>")
    second = enc(tok, "\\boxed{5}<|end|>")
    ids = torch.tensor([prompt + first + glue + second])
    labels = torch.tensor([[-100] * len(prompt) + first + [-100] * len(glue) + second])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(400):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 1e-3:
            break
    model.eval().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tool_engine(scripted_model, tmp_path_factory):
    eng = start_engine(scripted_model, tmp_path_factory.mktemp("tool_engine"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def tok(scripted_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(scripted_model)


@pytest.fixture(scope="module")
def scripted_hf(scripted_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(scripted_model, dtype=torch.float32).eval()


def expected_sample(tok, tool_text):
    prompt = enc(tok, "<|user|>2+3=<|end|><|assistant|>")
    first, glue, second = (
        enc(tok, CALL + "<|end|>"),
        enc(tok, f"<|tool|>{tool_text}<|end|><|assistant|>"),
        enc(tok, "\\boxed{5}<|end|>"),
    )
    return prompt, first, glue, second


def check(s: Sample, tok, hf, tool_text="5"):
    prompt, first, glue, second = expected_sample(tok, tool_text)
    assert s.tokens == prompt + first + glue + second
    assert s.loss_mask == [1] * len(first) + [0] * len(glue) + [1] * len(second)
    assert s.metadata["use_tool"] and s.status == Sample.Status.COMPLETED
    pos = [len(prompt) + i for i, m in enumerate(s.loss_mask) if m]
    ref = reference_logprobs(hf, s.tokens, pos)
    assert max(abs(s.rollout_log_probs[p - len(prompt)] - r) for p, r in zip(pos, ref, strict=True)) < 1e-4


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_call_round_trip(tool_engine, tok, scripted_hf, stream):
    from slime.agent.adapters import OpenAIAdapter

    adapter = OpenAIAdapter(tokenizer=tok, sglang_url=tool_engine.url, tool_parser="qwen25", engine_api_key=ENGINE_KEY)
    handle = serve(adapter)
    try:
        adapter.open_session("tool", sampling_defaults={"temperature": 0, "max_new_tokens": 100})
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="tool")
        msgs = [{"role": "user", "content": "2+3="}]
        if stream:
            chunks = list(client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, stream=True))
            [call] = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or []]
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
            assistant = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                ],
            }
        else:
            r = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
            [call] = r.choices[0].message.tool_calls
            finish = r.choices[0].finish_reason
            assistant = r.choices[0].message.model_dump(exclude_none=True)
        assert finish == "tool_calls" and call.function.name == "calculator" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert args == {"expression": "2+3"}
        msgs += [assistant, {"role": "tool", "tool_call_id": call.id, "content": str(eval(args["expression"]))}]
        r2 = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        assert r2.choices[0].message.content == "\\boxed{5}" and r2.choices[0].finish_reason == "stop"
        [s] = asyncio.run(adapter.finish_session("tool", base_sample=Sample(index=1, prompt="2+3="), reward=1.0))
        check(s, tok, scripted_hf)
        assert s.response.endswith("\\boxed{5}<|end|>")
    finally:
        handle.stop()


def test_anthropic_tool_use_round_trip(tool_engine, tok, scripted_hf):
    from slime.agent.adapters import AnthropicAdapter

    adapter = AnthropicAdapter(
        tokenizer=tok, sglang_url=tool_engine.url, tool_parser="qwen25", engine_api_key=ENGINE_KEY
    )
    handle = serve(adapter)
    try:
        adapter.open_session("atool", sampling_defaults={"temperature": 0})
        client = anthropic.Anthropic(base_url=handle.url, api_key="atool")
        tools = [
            {
                "name": "calculator",
                "description": "Evaluate arithmetic.",
                "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
            }
        ]
        msgs = [{"role": "user", "content": "2+3="}]
        m = client.messages.create(model="tiny", max_tokens=100, messages=msgs, tools=tools)
        assert m.stop_reason == "tool_use"
        [use] = [b for b in m.content if b.type == "tool_use"]
        assert use.name == "calculator" and use.input == {"expression": "2+3"}
        msgs += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]},
        ]
        with client.messages.stream(model="tiny", max_tokens=100, messages=msgs, tools=tools) as stream:
            final = stream.get_final_message()
        assert final.content[0].text == "\\boxed{5}" and final.stop_reason == "end_turn"
        [s] = asyncio.run(adapter.finish_session("atool", base_sample=Sample(index=2, prompt="2+3="), reward=1.0))
        check(s, tok, scripted_hf)
    finally:
        handle.stop()
