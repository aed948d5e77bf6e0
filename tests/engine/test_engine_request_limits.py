"""What one request can cost an engine: a client holding the key must not stall the others.

- stop strings are bounded in number and length, and searched per step only where a new token
  can complete one (the result is the same as searching the whole output every step);
- a prompt text too long to fit the context is refused before it is tokenized;
- a large body is parsed and tokenized off the event loop: a short request is answered while a
  megabyte of text is being tokenized.
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from engine_test_utils import start_engine

from slime.engine.request import Req, check_stop_strings
from slime.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, BadRequest, SamplingParams


# ------------------------------------------------------------------------------- stop strings
def _reference_stop(ids: list[int], stop: list[str], tokenizer, skip: bool) -> tuple[int, str] | None:
    """The plain rule: decode the whole output, take the earliest stop string in it."""
    text = tokenizer.decode(ids, skip_special_tokens=skip)
    found = [(text.find(s), s) for s in stop if s in text]
    return min(found, key=lambda f: f[0]) if found else None


class _CountingTokenizer:
    """The real tokenizer, recording how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, []
        self.all_special_ids = tokenizer.all_special_ids

    def decode(self, ids, **kw):
        self.decoded.append(len(ids))
        return self.tokenizer.decode(ids, **kw)


@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "keep_special"])
def test_windowed_stop_check_finds_what_a_whole_output_search_finds(tokenizer, skip):
    """Random outputs (special tokens and split multi-byte characters included) and stop strings
    cut from them: the step and place each request finishes at match a whole-output search."""
    rng = random.Random(0)
    vocab = len(tokenizer)
    matched = 0
    for trial in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(5, 80))]
        text = tokenizer.decode(ids, skip_special_tokens=skip)
        stop = []
        for _ in range(rng.randrange(1, 4)):
            if len(text) > 2 and rng.random() < 0.7:
                a = rng.randrange(len(text) - 1)
                stop.append(text[a : a + rng.randrange(1, 12)])
            else:
                stop.append(rng.choice(["ab", "\u00e9", "12", "</s>", "x" * 20]))
        stop = [s for s in stop if s]
        params = SamplingParams.from_dict({"stop": stop, "skip_special_tokens": skip}, vocab_size=vocab)
        counting = _CountingTokenizer(tokenizer)
        r = Req(input_ids=[1], params=params)
        want_step = want = None
        for step, t in enumerate(ids):
            r.output_ids.append(t)
            if want_step is None:
                want = _reference_stop(r.output_ids, stop, tokenizer, skip)
                want_step = step if want else None
            check_stop_strings(r, counting)
            if r.finish_reason is not None:
                break
        if want is None:
            assert r.finish_reason is None, (trial, stop)
            continue
        matched += 1
        assert step == want_step, (trial, stop)
        assert (r.stop_str_pos, r.finish_reason["matched"]) == want, (trial, stop)
    assert matched > 150  # the cut stop strings do match


def test_a_step_decodes_a_window_as_long_as_the_stop_strings_not_the_output(tokenizer):
    params = SamplingParams.from_dict({"stop": ["never appears \u2603"]}, vocab_size=len(tokenizer))
    counting = _CountingTokenizer(tokenizer)
    r = Req(input_ids=[1], params=params)
    rng = random.Random(1)
    for _ in range(2000):
        r.output_ids.append(rng.randrange(10, len(tokenizer)))  # no special tokens
        check_stop_strings(r, counting)
    assert r.finish_reason is None
    window = params.stop_max_bytes + 3 + 1
    assert counting.decoded[0] == 1 and max(counting.decoded) == window, max(counting.decoded)


def test_stop_strings_are_bounded_in_number_and_length():
    SamplingParams.from_dict({"stop": ["s"] * MAX_STOP_STRINGS}, vocab_size=10)
    with pytest.raises(BadRequest, match=f"has {MAX_STOP_STRINGS + 1} stop strings; at most {MAX_STOP_STRINGS}"):
        SamplingParams.from_dict({"stop": ["s"] * (MAX_STOP_STRINGS + 1)}, vocab_size=10)
    with pytest.raises(BadRequest, match=f"at most {MAX_STOP_CHARS} in all"):
        SamplingParams.from_dict({"stop": ["x" * (MAX_STOP_CHARS // 2 + 1)] * 2}, vocab_size=10)


def test_twenty_thousand_stop_strings_are_refused_by_the_engine(engine):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "stop": [f"s{i}" for i in range(20_000)]}}
    with httpx.Client(timeout=30, trust_env=False) as h:
        r = h.post(engine.url + "/generate", json=body)
    assert r.status_code == 400 and "20000 stop strings" in r.text, r.text


# ----------------------------------------------------------------------------- long prompt text
def test_a_text_longer_than_the_context_can_hold_is_refused_untokenized(engine):
    text = "12+34=" * 350_000  # 2.1 MB; the tiny tokenizer takes ~5 s for it
    with httpx.Client(timeout=60, trust_env=False) as h:
        t0 = time.monotonic()
        r = h.post(engine.url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
        took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    assert f"has {len(text)} characters, more than the context length can hold (256 tokens" in r.text
    assert took < 2.0, took  # refused before the tokenizer saw it


@pytest.fixture(scope="module")
def long_context_engine(tmp_path_factory):
    """A tiny model whose context is a million tokens: a megabyte of text passes the character cap
    and is tokenized (seconds), then refused for its length in tokens."""
    from slime.data.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("long-context"), max_position_embeddings=2**20)
    eng = start_engine(model, "--max-total-tokens", "4096", log_dir=tmp_path_factory.mktemp("long_log"))
    yield eng
    eng.stop()


def test_a_short_request_is_answered_while_a_long_text_is_tokenized(long_context_engine):
    url = long_context_engine.url + "/generate"
    text = "12+34=" * 250_000  # 1.5 MB: seconds of tokenizing
    big: dict = {}

    def send_big():
        with httpx.Client(timeout=120, trust_env=False) as h:
            big["response"] = h.post(url, json={"text": text, "sampling_params": {"max_new_tokens": 1}})
            big["done"] = time.monotonic()

    thread = threading.Thread(target=send_big)
    thread.start()
    time.sleep(0.5)  # the body is read and handed to the parse thread
    with httpx.Client(timeout=30, trust_env=False) as h:
        t0 = time.monotonic()
        small = h.post(url, json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        answered = time.monotonic()
    thread.join(timeout=120)
    assert small.status_code == 200, small.text
    assert answered - t0 < 1.0, answered - t0
    assert "done" in big and big["done"] > answered, "the long text should still have been tokenizing"
    refused = big["response"]
    # tokenized, then refused for its length: an error body, not a traceback
    assert refused.status_code == 400 and json.loads(refused.text)["error"]["message"].startswith("prompt has ")
