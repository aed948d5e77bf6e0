"""/v1/models, /v1/completions and /v1/chat/completions on a real engine server process, called
with the official `openai` client: answers, streaming, n, stop, log-probs (checked against
/generate's for the same tokens), usage, refusals and the API key."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from engine_test_utils import start_engine

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KEY = "sk-openai-test"
NAME = "tiny-chat"
MESSAGES = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "12+34="}]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    eng = start_engine(
        tiny_model_dir,
        *("--api-key", KEY, "--served-model-name", NAME, "--tool-call-parser", "qwen25"),
        *("--step-delay-ms", "5"),  # a long generation lasts long enough to leave in the middle of
        log_dir=tmp_path_factory.mktemp("openai_engine_log"),
    )
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        yield client


def native_logprobs(server, prompt_ids: list[int], output_ids: list[int], top: int) -> list[list]:
    """The engine's own log-probs of `output_ids` after `prompt_ids` (temperature 0), from /generate:
    one prefill of prompt + output, its input log-probs and top-k from the prompt's end."""
    body = {
        "input_ids": prompt_ids + output_ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": len(prompt_ids),
        "top_logprobs_num": top,
        "return_text_in_logprobs": True,
    }
    r = httpx.post(f"{server.url}/generate", json=body, headers=auth(), timeout=60)
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return [[*lp, tops] for lp, tops in zip(meta["input_token_logprobs"], meta["input_top_logprobs"], strict=True)]


def streamed_text(chunks) -> tuple[str, list]:
    texts, finishes = [], []
    for c in chunks:
        for ch in c.choices:
            texts.append(ch.text if hasattr(ch, "text") else (ch.delta.content or ""))
            if ch.finish_reason is not None:
                finishes.append(ch.finish_reason)
    return "".join(texts), finishes


def auth() -> dict:
    return {"Authorization": f"Bearer {KEY}"}


def test_native_top_logprobs(server, tokenizer):
    """/generate's top_logprobs_num (SGLang's): each output token's k best, best first."""
    body = {
        "input_ids": tokenizer.encode("1+1="),
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    meta = httpx.post(f"{server.url}/generate", json=body, headers=auth(), timeout=60).json()["meta_info"]
    assert len(meta["output_top_logprobs"]) == len(meta["output_token_logprobs"]) == 4
    for (lp, tok, _), tops in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert len(tops) == 2 and tops[0][1] == tok and tops[0][0] == pytest.approx(lp) and tops[1][0] <= tops[0][0]


def test_models_list(oai, server):
    models = oai.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert oai.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("other")


def test_completion_stream_joins_to_the_same_text(oai):
    for temperature in (0.0, 1.0):
        kw = {"model": NAME, "prompt": "12+34=", "max_tokens": 12, "temperature": temperature, "seed": 7}
        whole = oai.completions.create(**kw)
        (choice,) = whole.choices
        assert whole.object == "text_completion" and whole.model == NAME
        chunks = list(oai.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        text, finishes = streamed_text(chunks)
        assert text == choice.text and finishes == [choice.finish_reason]
        assert chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) == (
            whole.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
        )


def test_completion_n_seed_and_usage(oai, tokenizer):
    kw = {"model": NAME, "prompt": "7+5=", "max_tokens": 8, "temperature": 1.0}
    both = oai.completions.create(**kw, n=2, seed=11, extra_body={"return_token_ids": True})
    assert [c.index for c in both.choices] == [0, 1]
    # sample j draws from seed + j: sample 0 is what n=1 gives, and the two differ
    assert [c.text for c in both.choices] == [oai.completions.create(**kw, seed=s).choices[0].text for s in (11, 12)]
    assert both.usage.prompt_tokens == len(tokenizer.encode("7+5="))  # the prompt once for its n samples
    assert both.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in both.choices)
    assert both.usage.total_tokens == both.usage.prompt_tokens + both.usage.completion_tokens


def test_completion_stop(oai):
    kw = {"model": NAME, "prompt": "What is 99+9?", "max_tokens": 24, "temperature": 1.0, "seed": 3}
    kw["extra_body"] = {"ignore_eos": True}
    free = oai.completions.create(**kw).choices[0].text
    stop = next(ch for ch in free[1:] if ch.isascii() and ch.isprintable() and not ch.isspace())  # written later on
    cut = oai.completions.create(**kw, stop=[stop, "never-written"])
    assert cut.choices[0].text == free[: free.index(stop)]
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["matched_stop"] == stop
    text, finishes = streamed_text(oai.completions.create(**kw, stop=stop, stream=True))
    assert text == cut.choices[0].text and finishes == ["stop"]


def test_completion_logprobs_and_echo_match_generate(oai, server, tokenizer):
    prompt = tokenizer.encode("3+4=")
    r = oai.completions.create(
        model=NAME, prompt=prompt, max_tokens=5, temperature=0, logprobs=2, extra_body={"return_token_ids": True}
    )
    (c,) = r.choices
    out = c.model_extra["token_ids"]
    ref = native_logprobs(server, prompt, out, 2)
    assert c.logprobs.token_logprobs == pytest.approx([x[0] for x in ref], abs=1e-4)
    assert c.logprobs.tokens == [x[2] for x in ref]
    assert all(
        len(top) <= 2 and max(top.values()) >= lp - 1e-4
        for top, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs, strict=True)
    )
    # echo: the prompt's text and log-probs first (its first token has none), then the output's
    e = oai.completions.create(model=NAME, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True)
    (ce,) = e.choices
    assert ce.text.startswith(tokenizer.decode(prompt))
    assert ce.logprobs.token_logprobs[0] is None and ce.logprobs.top_logprobs[0] is None
    ref_prompt = native_logprobs(server, prompt[:1], prompt[1:] + out[:1], 1)
    assert ce.logprobs.token_logprobs[1:] == pytest.approx([x[0] for x in ref_prompt], abs=1e-4)
    assert ce.logprobs.text_offset[:2] == [0, len(ce.logprobs.tokens[0])]


def test_chat_answer_stream_and_usage(oai, tokenizer):
    kw = {"model": NAME, "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "seed": 1}
    whole = oai.chat.completions.create(**kw, extra_body={"return_token_ids": True})
    (choice,) = whole.choices
    assert whole.object == "chat.completion" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert whole.usage.completion_tokens == len(choice.model_extra["token_ids"])
    chunks = list(oai.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    text, finishes = streamed_text(chunks)
    assert text == choice.message.content and finishes == [choice.finish_reason]


def test_chat_logprobs_match_generate(oai, server):
    r = oai.chat.completions.create(
        model=NAME,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True, "return_prompt_token_ids": True},
    )
    (c,) = r.choices
    ref = native_logprobs(server, c.model_extra["prompt_token_ids"], c.model_extra["token_ids"], 3)
    assert len(c.logprobs.content) == len(ref) == r.usage.completion_tokens
    for got, (lp, _, text, tops) in zip(c.logprobs.content, ref, strict=True):
        assert got.logprob == pytest.approx(lp, abs=1e-4) and got.token == text
        assert got.bytes == list(text.encode())
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([t[0] for t in tops], abs=1e-4)
        assert [t.token for t in got.top_logprobs] == [t[2] for t in tops]
        assert got.top_logprobs[0].logprob == pytest.approx(got.logprob, abs=1e-4)  # temperature 0: the best one
    streamed = oai.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    lps = [t.logprob for ch in streamed for choice in ch.choices if choice.logprobs for t in choice.logprobs.content]
    assert lps == pytest.approx([t.logprob for t in c.logprobs.content], abs=1e-4)


def test_chat_with_tools(oai):
    """Tools reach the template and the output goes through the tool-call parser (the tiny model
    writes no call: plain content); streamed, the parsed message comes whole at the end."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    kw = {"model": NAME, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "tools": tools}
    whole = oai.chat.completions.create(**kw)
    (choice,) = whole.choices
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    text, finishes = streamed_text(oai.chat.completions.create(**kw, stream=True))
    assert text == (choice.message.content or "") and finishes == [choice.finish_reason]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda o: o.completions.create(model=NAME, prompt="1+1=", n=0), "n"),
        (lambda o: o.completions.create(model=NAME, prompt="1+1=", max_tokens=100_000), "max_tokens"),
        (lambda o: o.completions.create(model=NAME, prompt="1+1=", extra_body={"bogus": 1}), "bogus"),
        (lambda o: o.chat.completions.create(model=NAME, messages=MESSAGES, temperature=-1), "temperature"),
        (lambda o: o.chat.completions.create(model=NAME, messages=[{"role": "x", "content": "y"}]), "messages[0].role"),
    ],
)
def test_bad_requests_are_400_naming_the_field(oai, call, field):
    with pytest.raises(openai.BadRequestError) as e:
        call(oai)
    assert e.value.status_code == 400 and field in e.value.message
    assert e.value.body == {
        "object": "error",
        "message": e.value.body["message"],
        "type": "BadRequestError",
        "param": field,
        "code": 400,
    }


def test_api_key(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=NAME, prompt="1+1=", max_tokens=1)
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES}, timeout=30)
    assert r.status_code == 401 and r.json()["object"] == "error" and r.json()["code"] == 401


def test_stream_client_leaving_aborts_its_requests(oai, server):
    def running() -> int:
        return httpx.get(f"{server.url}/get_load", headers=auth(), timeout=10).json()["num_reqs"]

    # 240 tokens at 5 ms a step take over a second; aborted, the requests leave at the next step
    stream = oai.completions.create(
        model=NAME, prompt="1+1=", max_tokens=240, n=2, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    assert running() == 2
    stream.close()
    left = time.monotonic()
    while running() and time.monotonic() < left + 5:
        time.sleep(0.02)
    assert running() == 0 and time.monotonic() - left < 0.6
