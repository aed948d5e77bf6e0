"""The OpenAI-compatible routes' pure parts, without a server: request validation (the field each
refusal names), chat rendering with tools, tool-call parsing into the answer, and what a stream
may send before a request finishes."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from slime.engine.openai_api.protocol import APIError, Context, model_sampling_defaults, parse_chat, parse_completion
from slime.engine.openai_api.responses import chat_response, completion_response
from slime.engine.openai_api.stream import Detokenized, streamable_text
from slime.engine.sampling import SamplingParams

CONTEXT = 64


@pytest.fixture(scope="module")
def ctx(tokenizer):
    runner = SimpleNamespace(
        tokenizer=tokenizer,
        vocab_size=len(tokenizer),
        context_length=CONTEXT,
        max_token_chars=16,
        max_prompt_chars=CONTEXT * 16,
        eos_token_ids={tokenizer.eos_token_id},
    )
    return Context(runner=runner, max_total_tokens=None, max_batch=8, model_name="tiny", tool_parser="qwen25")


def refused(parse, body, ctx) -> APIError:
    with pytest.raises(APIError) as e:
        parse(body, ctx)
    assert e.value.status == 400 and e.value.body()["type"] == "BadRequestError"
    return e.value


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": "1+1=", "n": 0}, "n", "n must be >= 1"),
        ({"prompt": "1+1=", "max_tokens": 0}, "max_tokens", "max_tokens must be >= 1"),
        ({"prompt": "1+1=", "max_tokens": CONTEXT}, "max_tokens", "context length"),
        ({"prompt": "1+1=", "temperature": "hot"}, "temperature", "finite number"),
        ({"prompt": "1+1=", "top_p": 0}, "top_p", "top_p must be in (0, 1]"),
        ({"prompt": "1+1=", "logprobs": 21}, "logprobs", "logprobs must be in [0, 20]"),
        ({"prompt": "1+1=", "stop": [""]}, "stop", "non-empty string"),
        ({"prompt": "1+1=", "presence_penalty": 1.0}, "presence_penalty", "not supported"),
        ({"prompt": "1+1=", "bogus": 1}, "bogus", "unknown field 'bogus'"),
        ({"prompt": "1+1=", "n": 3, "best_of": 5}, "best_of", "best_of"),
        ({"prompt": ["a", "b"], "n": 5}, "n", "--max-batch-request-size 8"),
        ({"prompt": [[1, 2], []]}, "prompt", "prompt[1] must be a non-empty list"),
        ({"prompt": [1, 10**9]}, "prompt", "not a token id"),
        ({"max_tokens": 3}, "prompt", "prompt is required"),
        ({"prompt": "x", "stream_options": {"continuous_usage_stats": True}}, "stream_options", "not supported"),
    ],
)
def test_completion_refusals_name_the_field(ctx, body, param, words):
    e = refused(parse_completion, body, ctx)
    assert e.param == param and words in str(e)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'robot' is not supported"),
        ({"messages": [{"content": "x"}]}, "messages[0]", "with a role"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", "logprobs: true"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]", "name"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}, "tool_choice", "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}, "max_completion_tokens", ">="),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs", "true or false"),
        ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt", "unknown field"),
        ({"messages": [{"role": "user", "content": "x" * 2000}]}, "messages", "characters"),
    ],
)
def test_chat_refusals_name_the_field(ctx, body, param, words):
    e = refused(parse_chat, body, ctx)
    assert e.param == param and words in str(e)


def test_completion_plan(ctx, tokenizer):
    plan = parse_completion(
        {"prompt": ["1+1=", "2+2="], "n": 2, "seed": 5, "max_tokens": 4, "logprobs": 2, "echo": True, "rid": "r"}, ctx
    )
    assert plan.model == "tiny" and plan.n == 2 and plan.num_prompts == 2 and len(plan.reqs) == 4
    assert [r.input_ids for r in plan.reqs] == [tokenizer.encode("1+1=")] * 2 + [tokenizer.encode("2+2=")] * 2
    assert [r.params.sampling_seed for r in plan.reqs] == [5, 6, 5, 6]  # sample j draws from seed + j
    assert [r.rid for r in plan.reqs] == ["r-0", "r-1", "r-2", "r-3"]
    assert all(r.return_logprob and r.top_logprobs_num == 2 and r.logprob_start_len == 0 for r in plan.reqs)
    assert all(r.max_new_tokens == 4 for r in plan.reqs)
    ids = parse_completion({"prompt": [5, 6, 7], "max_tokens": 2}, ctx)
    assert ids.reqs[0].input_ids == [5, 6, 7] and ids.prompt_texts == [None] and not ids.reqs[0].return_logprob


def test_chat_renders_the_template_with_the_tools(ctx, tokenizer):
    """`tools` reach the chat template (tool_choice "none" withholds them); with a tool parser the
    output keeps its special tokens for the parser; no max_tokens runs to the context length."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{%- for t in tools or [] %}[tool {{ t.function.name }}]{% endfor -%}"
        "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor -%}<|assistant|>"
    )
    tool_ctx = Context(**{**vars(ctx), "runner": SimpleNamespace(**{**vars(ctx.runner), "tokenizer": tok})})
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "1+1?"}]}
    plan = parse_chat({**body, "tools": tools}, tool_ctx)
    text = tok.decode(plan.reqs[0].input_ids)
    assert text == "[tool add]<|system|>be brief<|end|><|user|>1+1?<|end|><|assistant|>"
    assert plan.tool_parser == "qwen25" and plan.parses_output and not plan.reqs[0].params.skip_special_tokens
    assert plan.reqs[0].max_new_tokens == CONTEXT - len(plan.reqs[0].input_ids) - 1
    plain = parse_chat({**body, "tools": tools, "tool_choice": "none"}, tool_ctx)
    assert "[tool" not in tok.decode(plain.reqs[0].input_ids) and not plain.parses_output


def _result(text: str, finish: dict, completion_tokens: int) -> dict:
    return {"text": text, "meta_info": {"finish_reason": finish, "completion_tokens": completion_tokens}}


def test_chat_answer_parses_tool_calls(ctx, tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    plan = parse_chat({"messages": [{"role": "user", "content": "1+1?"}], "tools": tools, "n": 2}, ctx)
    call = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    results = [_result(call, {"type": "stop", "matched": 1}, 9), _result("2", {"type": "length", "length": 1}, 1)]
    body = chat_response(plan, results, tokenizer)
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] == "Let me add."
    (tc,) = first["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"] == {"name": "add", "arguments": '{"a": 1, "b": 1}'}
    assert tc["id"].startswith("call_")
    assert second["message"] == {"role": "assistant", "content": "2"} and second["finish_reason"] == "length"
    n_prompt = len(plan.reqs[0].input_ids)
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 10, "total_tokens": n_prompt + 10}
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")


def test_completion_answer_echo_and_usage(ctx, tokenizer):
    plan = parse_completion({"prompt": ["1+1=", "22+2="], "echo": True, "max_tokens": 2}, ctx)
    results = [_result("2", {"type": "stop", "matched": "\n"}, 2), _result("24", {"type": "length", "length": 2}, 2)]
    body = completion_response(plan, results, tokenizer)
    assert [c["text"] for c in body["choices"]] == ["1+1=2", "22+2=24"]
    assert body["choices"][0]["matched_stop"] == "\n" and body["choices"][0]["finish_reason"] == "stop"
    want_prompt = len(tokenizer.encode("1+1=")) + len(tokenizer.encode("22+2="))
    assert body["usage"]["prompt_tokens"] == want_prompt and body["usage"]["completion_tokens"] == 4


def _running(tokenizer, text: str, **sp) -> SimpleNamespace:
    return SimpleNamespace(
        output_ids=tokenizer.encode(text), params=SamplingParams(**sp), stop_ids=frozenset({tokenizer.eos_token_id})
    )


def test_stream_holds_back_what_the_final_text_may_drop(tokenizer):
    """A stream sends only text the final answer is sure to start with."""
    assert streamable_text(_running(tokenizer, "12 + 3"), tokenizer)[0] == "12 + 3"
    # a stop string's possible start is held back, and anything from a matched one
    assert streamable_text(_running(tokenizer, "12 + 3", stop=["+ 4"]), tokenizer)[0] == "12 +"
    assert streamable_text(_running(tokenizer, "ab STOP cd", stop=["STOP"]), tokenizer)[0] == "ab "
    assert streamable_text(_running(tokenizer, "ab STOP cd", stop=["STOP"], no_stop_trim=True), tokenizer)[0] == (
        "ab STOP cd"
    )
    # the last token may be the stop token the answer drops; an unfinished character waits
    eos = tokenizer.decode([tokenizer.eos_token_id])
    assert streamable_text(_running(tokenizer, "7" + eos, skip_special_tokens=False), tokenizer)[0] == "7"
    r, decoded = _running(tokenizer, "a"), Detokenized()
    full = tokenizer.encode("a\U0001f642b")
    cut = next(k for k in range(len(full)) if tokenizer.decode(full[:k]).endswith("\ufffd"))  # mid-character
    r.output_ids = full[:cut]
    assert streamable_text(r, tokenizer, decoded) == ("", cut)
    r.output_ids = full
    assert streamable_text(r, tokenizer, decoded) == ("a\U0001f642b", len(full))


def test_incremental_decoding_matches_the_whole_text(tokenizer):
    """Decoding a growing output a window at a time gives the text of decoding it whole."""
    text = "Hello, World!\n\tThe answer is \\boxed{1,000}. \u00e9\u20ac\U0001f642 x<|end|>y"
    for skip in (True, False):
        r, decoded = _running(tokenizer, text, skip_special_tokens=skip), Detokenized()
        ids = list(r.output_ids)
        for k in range(1, len(ids) + 1):
            r.output_ids = ids[:k]
            got, _ = streamable_text(r, tokenizer, decoded)
            assert tokenizer.decode(ids[:k], skip_special_tokens=skip).startswith(got)
        assert got == tokenizer.decode(ids, skip_special_tokens=skip)


def test_model_sampling_defaults(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        '{"temperature": 0.7, "top_p": 0.8, "top_k": 20, "do_sample": true}'
    )
    assert model_sampling_defaults(str(tmp_path)) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    (tmp_path / "generation_config.json").write_text('{"top_p": 7}')
    assert model_sampling_defaults(str(tmp_path)) == {}
    assert model_sampling_defaults(str(tmp_path / "missing")) == {}
