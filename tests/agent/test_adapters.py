"""The adapters against a real engine server, driven by the official `openai` and `anthropic`
clients: chat and streaming, exact tokens (recorded == what the engine produces for that prompt,
log-probs == an HF forward over the sample), concurrent sessions, history rewrites, error shapes,
turn cap, context budget, unknown / closed / empty sessions."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

import anthropic
import httpx
import openai
import pytest
from conftest import ENGINE_KEY, reference_logprobs

from slime.utils.types import Sample

pytestmark = pytest.mark.timeout(300)

BASE = Sample(index=0, group_index=0, prompt="p")


def finish(adapter, sid, reward=1.0):
    return asyncio.run(adapter.finish_session(sid, base_sample=BASE, reward=reward))


def engine_generate(engine, ids, n):
    r = httpx.post(
        engine.url + "/generate",
        headers={"Authorization": f"Bearer {ENGINE_KEY}"},
        timeout=60,
        json={
            "input_ids": ids,
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": n,
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
        },
    )
    r.raise_for_status()
    return r.json()["output_ids"]


def render(tokenizer, messages):
    return tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )


def check_logprobs(hf_model, s: Sample):
    start = len(s.tokens) - s.response_length
    pos = [start + i for i, m in enumerate(s.loss_mask) if m]
    assert pos, "nothing trained"
    ref = reference_logprobs(hf_model, s.tokens, pos)
    got = [s.rollout_log_probs[p - start] for p in pos]
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4
    assert all(s.rollout_log_probs[i] == 0.0 for i, m in enumerate(s.loss_mask) if not m)


def test_openai_chat_then_stream_is_one_exact_sample(openai_adapter, engine, tokenizer, hf_model):
    ad = openai_adapter
    ad.open_session("chat", sampling_defaults={"max_new_tokens": 8})
    client = openai.OpenAI(base_url=ad.base_url, api_key="chat")  # the agent's key is its session id
    msgs = [{"role": "system", "content": "Add."}, {"role": "user", "content": "12+7="}]
    r = client.chat.completions.create(model="tiny", messages=msgs, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(render(tokenizer, msgs))
    p1 = render(tokenizer, msgs)
    o1 = engine_generate(engine, p1, 8)  # what the engine itself produces for this prompt
    assert r.usage.completion_tokens == len(o1)
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and 3+4="}]
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=msgs,
            temperature=0,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens <= 5
    text2 = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    [s] = finish(ad, "chat", reward=0.25)
    # turn 2's prompt is turn 1's exact tokens plus the template's glue and the new user message
    end = [] if o1[-1] == tokenizer.eos_token_id else tokenizer.encode("<|end|>", add_special_tokens=False)
    glue = end + tokenizer.encode("<|user|>and 3+4=<|end|><|assistant|>", add_special_tokens=False)
    p2 = p1 + o1 + glue
    o2 = engine_generate(engine, p2, 5)
    assert s.tokens == p2 + o2
    assert s.loss_mask == [1] * len(o1) + [0] * len(glue) + [1] * len(o2)
    assert s.response_length == len(s.tokens) - len(p1) and s.reward == 0.25 and s.session_id == "chat"
    assert tokenizer.decode(o2[:-1] if o2[-1] == tokenizer.eos_token_id else o2) == text2
    check_logprobs(hf_model, s)


def test_anthropic_messages_stream_and_tool_blocks(anthropic_adapter, engine, tokenizer, hf_model):
    ad = anthropic_adapter
    ad.open_session("anth", sampling_defaults={"max_new_tokens": 6, "temperature": 0})
    client = anthropic.Anthropic(base_url=ad.base_url, api_key="anth")  # sent as X-Api-Key
    history = [
        {"role": "user", "content": "What is 40+2?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "40+2"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]},
    ]
    tools = [
        {
            "name": "calculator",
            "description": "Evaluate",
            "input_schema": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        }
    ]
    m = client.messages.create(model="tiny", max_tokens=6, system="Be brief.", messages=history, tools=tools)
    assert m.type == "message" and m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens")
    expected = render(
        tokenizer,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 40+2?"},
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": "42"},
        ],
    )
    assert m.usage.input_tokens == len(expected)
    with client.messages.stream(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and "content_block_delta" in events and events[-1] == "message_stop"
    assert final.usage.output_tokens <= 4
    count = client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert count.input_tokens == len(render(tokenizer, [{"role": "user", "content": "hi"}]))
    samples = finish(ad, "anth")
    assert len(samples) == 2  # two unrelated conversations in one session: two segments
    assert samples[0].tokens[: len(expected)] == expected
    assert samples[0].tokens[len(expected) :] == engine_generate(engine, expected, 6)
    for s in samples:
        check_logprobs(hf_model, s)


def test_concurrent_sessions_never_mix_tokens(openai_adapter, engine, tokenizer, hf_model):
    ad = openai_adapter
    sids = [f"conc-{i}" for i in range(6)]
    for sid in sids:
        ad.open_session(sid, sampling_defaults={"max_new_tokens": 6})

    def agent(i, sid):
        client = openai.OpenAI(base_url=ad.base_url, api_key=sid)
        msgs = [{"role": "user", "content": f"{i}{i}+{i}="}]
        for turn in range(2):
            r = client.chat.completions.create(model="tiny", messages=msgs, temperature=1.0, seed=100 + i)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"again {turn}"}]
        return msgs[0]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        firsts = list(pool.map(agent, range(6), sids))
    for sid, first in zip(sids, firsts, strict=True):
        [s] = finish(ad, sid)
        prompt = render(tokenizer, [first])
        assert s.tokens[: len(prompt)] == prompt  # this session's own prompt, nobody else's
        assert sum(1 for t in s.metadata["turns"] if t["role"] == "model") == 2
        check_logprobs(hf_model, s)  # each trained token's log-prob, in this session's context


def test_an_edited_history_splits_into_segments(openai_adapter, engine, tokenizer):
    ad = openai_adapter
    ad.open_session("edit", sampling_defaults={"max_new_tokens": 4})
    client = openai.OpenAI(base_url=ad.base_url, api_key="edit")
    msgs = [{"role": "user", "content": "1+1="}]
    r1 = client.chat.completions.create(model="tiny", messages=msgs, temperature=0)
    msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "ok"}]
    client.chat.completions.create(model="tiny", messages=msgs, temperature=0)
    compacted = [{"role": "user", "content": "Summary: 1+1 was asked. ok"}]  # the agent compacted its history
    client.chat.completions.create(model="tiny", messages=compacted, temperature=0)
    s1, s2 = finish(ad, "edit")
    assert [s1.metadata["segment"], s2.metadata["segment"]] == [0, 1] and s1.metadata["num_segments"] == 2
    assert sum(t["role"] == "model" for t in s1.metadata["turns"]) == 2
    p3 = render(tokenizer, compacted)
    assert s2.tokens == p3 + engine_generate(engine, p3, 4) and s2.loss_mask == [1] * s2.response_length
    assert s1.rollout_id == s2.rollout_id == BASE.index


def test_error_shapes(openai_adapter, anthropic_adapter):
    with httpx.Client(timeout=30) as h:
        r = h.post(
            openai_adapter.base_url + "/chat/completions", content=b"{not json", headers={"Authorization": "Bearer err"}
        )
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = h.post(anthropic_adapter.base_url + "/v1/messages", content=b"[1]", headers={"x-api-key": "err"})
        assert r.status_code == 400
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        models = h.get(openai_adapter.base_url + "/models").json()
        assert models["object"] == "list" and models["data"][0]["object"] == "model"
    client = openai.OpenAI(base_url=openai_adapter.base_url, api_key="err", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"
    assert e.value.body["param"] == "messages[0].role"
    aclient = anthropic.Anthropic(base_url=anthropic_adapter.base_url, api_key="err", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        aclient.messages.create(model="tiny", max_tokens=2, messages=[])
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_turn_cap_context_budget_and_samples_so_far(openai_adapter, anthropic_adapter, engine, tokenizer):
    ad = openai_adapter  # max_turns_per_sid=4
    ad.open_session("cap", sampling_defaults={"max_new_tokens": 2})
    client = openai.OpenAI(base_url=ad.base_url, api_key="cap", max_retries=0)
    for _ in range(4):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=0)
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 429 and "max_turns_per_sid=4" in e.value.body["message"]
    samples = finish(ad, "cap")
    assert len(samples) == 4 and all(s.response_length == 2 for s in samples)  # the four turns served

    ad.open_session("ctx", sampling_defaults={"max_new_tokens": 50}, max_context_tokens=12)
    client = openai.OpenAI(base_url=ad.base_url, api_key="ctx", max_retries=0)
    short = [{"role": "user", "content": "1+1="}]
    r = client.chat.completions.create(model="tiny", messages=short, temperature=0)
    assert len(render(tokenizer, short)) + r.usage.completion_tokens <= 12  # generation capped to the budget
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a much longer prompt"}])
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"
    [s] = finish(ad, "ctx")  # the turn before the overflow is still a sample
    assert len(s.tokens) <= 12

    anthropic_adapter.open_session("actx", max_context_tokens=3)
    aclient = anthropic.Anthropic(base_url=anthropic_adapter.base_url, api_key="actx", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        aclient.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "too long"}])
    assert e.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": e.value.body["error"]["message"]},
    }
    assert "prompt is too long" in e.value.body["error"]["message"]
    assert finish(anthropic_adapter, "actx") == []


def test_unknown_closed_and_empty_sessions(openai_adapter, caplog):
    ad = openai_adapter
    client = openai.OpenAI(base_url=ad.base_url, api_key="never-opened", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.choices[0].message.role == "assistant"  # served, as slime does ...
    assert ad.manager.has_session("never-opened")  # ... and recorded under that id until someone finishes it
    [s] = finish(ad, "never-opened")
    assert s.response_length == 2
    with pytest.raises(openai.APIStatusError) as e:  # a finished session refuses stragglers
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert e.value.status_code == 503 and "is closed" in e.value.body["message"]

    ad.open_session("empty")
    with caplog.at_level(logging.WARNING):
        assert finish(ad, "empty") == []
    assert "session empty ended with no turns" in caplog.text
    with pytest.raises(ValueError, match="already exists"):
        ad.open_session("empty")
