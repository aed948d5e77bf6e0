"""/generate against a real server process: sampling parameters, log-probs, batching, errors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import httpx
import pytest
from engine_test_utils import reference_input_logprobs, reference_logprobs

pytestmark = pytest.mark.timeout(120)

TEXTS = ["12+34=", "7+5=", "The answer is", "What is 99+9? Let's think step by step.", "3", "1+1="]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(t) for t in TEXTS]


def gen(client, input_ids, **sp):
    extra = {k: sp.pop(k) for k in ("return_logprob", "logprob_start_len", "rid") if k in sp}
    return client.generate({"input_ids": input_ids, "sampling_params": sp, **extra})


def test_max_new_tokens_and_answer_shape(client, prompts):
    r = gen(client, prompts[0], max_new_tokens=7, temperature=0, ignore_eos=True, return_logprob=True, rid="abc")
    assert set(r) >= {"text", "output_ids", "meta_info"}
    m = r["meta_info"]
    assert len(r["output_ids"]) == 7
    assert m["finish_reason"] == {"type": "length", "length": 7}
    assert m["id"] == "abc"
    assert m["prompt_tokens"] == len(prompts[0]) and m["completion_tokens"] == 7 and m["cached_tokens"] == 0
    assert [t for _, t, _ in m["output_token_logprobs"]] == r["output_ids"]
    assert all(x[2] is None for x in m["output_token_logprobs"])
    assert "input_token_logprobs" not in m
    r0 = gen(client, prompts[0], max_new_tokens=0, temperature=0)
    assert r0["output_ids"] == [] and r0["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_null_max_new_tokens_runs_to_the_context_length(client, tiny_model_dir):
    """As SGLang: an explicit null is no limit of its own (slime's --rollout-max-response-len default),
    an absent one is 128; a prompt that leaves no room is a 400."""
    context = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    prompt = list(range(5, 5 + context - 20))
    r = gen(client, prompt, max_new_tokens=None, temperature=0, ignore_eos=True)
    assert len(r["output_ids"]) == context - len(prompt) - 1 == 19
    assert r["meta_info"]["finish_reason"]["type"] == "length"
    assert len(gen(client, prompt[:5], temperature=0, ignore_eos=True)["output_ids"]) == 128
    with pytest.raises(Exception, match="no room left"):
        gen(client, list(range(5, 5 + context - 1)), max_new_tokens=None)


def test_greedy_deterministic_and_independent_of_batch(client, prompts):
    single = [gen(client, p, max_new_tokens=10, temperature=0, ignore_eos=True)["output_ids"] for p in prompts]
    again = [gen(client, p, max_new_tokens=10, temperature=0, ignore_eos=True)["output_ids"] for p in prompts]
    assert single == again
    batch = gen(client, prompts, max_new_tokens=10, temperature=0, ignore_eos=True)
    assert isinstance(batch, list) and [b["output_ids"] for b in batch] == single
    # concurrent separate requests land in shared batches of varying composition
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        conc = list(ex.map(lambda p: gen(client, p, max_new_tokens=10, temperature=0, ignore_eos=True), prompts * 2))
    assert [c["output_ids"] for c in conc] == single * 2


def test_same_seed_same_sample_and_top_k_1_is_greedy(client, prompts):
    sp = dict(max_new_tokens=12, temperature=1.0, ignore_eos=True, sampling_seed=1234)
    a = gen(client, prompts[1], **sp)["output_ids"]
    b = gen(client, prompts[1], **sp)["output_ids"]
    assert a == b
    # inside a batch with other (unseeded) rows: same tokens
    body = {
        "input_ids": [prompts[0], prompts[1], prompts[2]],
        "sampling_params": [
            dict(max_new_tokens=12, temperature=1.0, ignore_eos=True),
            sp,
            dict(max_new_tokens=3, temperature=0.5),
        ],
    }
    assert client.generate(body)[1]["output_ids"] == a
    others = {tuple(gen(client, prompts[1], **{**sp, "sampling_seed": s})["output_ids"]) for s in range(4)}
    assert len(others) > 1  # different seeds sample different continuations
    greedy = gen(client, prompts[3], max_new_tokens=10, temperature=0, ignore_eos=True)["output_ids"]
    topk1 = gen(client, prompts[3], max_new_tokens=10, temperature=1.3, top_k=1, ignore_eos=True)["output_ids"]
    assert topk1 == greedy


def test_stop_token_ids(client, prompts):
    ref = gen(client, prompts[0], max_new_tokens=10, temperature=0, ignore_eos=True)["output_ids"]
    stop = ref[3]
    first = ref.index(stop)
    r = gen(client, prompts[0], max_new_tokens=10, temperature=0, stop_token_ids=[stop])
    assert r["output_ids"] == ref[: first + 1]  # the stop token is part of output_ids
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stop_strings(client, tokenizer, prompts):
    ref = gen(client, prompts[2], max_new_tokens=16, temperature=0, ignore_eos=True)
    text = ref["text"]
    # a stop string made of two characters of the greedy text (starting at its 4th character)
    stop = text[3:5]
    assert len(stop) == 2, text
    pos = text.index(stop)
    r = gen(client, prompts[2], max_new_tokens=16, temperature=0, ignore_eos=True, stop=[stop, "\x00never"])
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert r["text"] == text[:pos]
    ids = r["output_ids"]
    assert ids == ref["output_ids"][: len(ids)]
    assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])
    kept = gen(client, prompts[2], max_new_tokens=16, temperature=0, ignore_eos=True, stop=stop, no_stop_trim=True)
    assert kept["output_ids"] == ids and stop in kept["text"] and kept["text"].startswith(text[:pos] + stop)


def test_min_new_tokens_suppresses_stop_tokens(client, prompts):
    ref = gen(client, prompts[4], max_new_tokens=8, temperature=0, ignore_eos=True)["output_ids"]
    stop = ref[0]
    r = gen(client, prompts[4], max_new_tokens=8, temperature=0, stop_token_ids=[stop])
    assert r["output_ids"] == [stop]
    r = gen(
        client,
        prompts[4],
        max_new_tokens=8,
        min_new_tokens=4,
        temperature=0,
        stop_token_ids=[stop],
        return_logprob=True,
    )
    out = r["output_ids"]
    assert len(out) >= 4 and stop not in out[:3]
    if r["meta_info"]["finish_reason"]["type"] == "stop":
        assert out[-1] == stop and stop not in out[:-1]


@pytest.mark.parametrize("temperature,extra", [(0.0, {}), (0.7, {"top_p": 0.9, "top_k": 50})])
def test_output_logprobs_match_hf_forward(client, hf_model, prompts, temperature, extra):
    # a batch of prompts of different lengths: left padding must not change anything
    body = {
        "input_ids": prompts,
        "sampling_params": dict(max_new_tokens=9, temperature=temperature, ignore_eos=True, **extra),
        "return_logprob": True,
    }
    results = client.generate(body)
    worst = 0.0
    for p, r in zip(prompts, results, strict=True):
        got = [lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]]
        want = reference_logprobs(hf_model, p, r["output_ids"], temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want, strict=True)))
    assert worst < 1e-4


@pytest.mark.parametrize("start", [0, 3])
def test_input_logprobs_match_hf_forward(client, hf_model, prompts, start):
    body = {
        "input_ids": [prompts[3], prompts[0]],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": start,
    }
    for p, r in zip([prompts[3], prompts[0]], client.generate(body), strict=True):
        got = r["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in got] == p[start:]
        want = reference_input_logprobs(hf_model, p, start)
        for (lp, _, _), w in zip(got, want, strict=True):
            if w is None:
                assert lp is None
            else:
                assert abs(lp - w) < 1e-4
    # with a temperature the input log-probs use logits / T as well
    r = gen(client, prompts[3], max_new_tokens=1, temperature=0.5, return_logprob=True, logprob_start_len=1)
    want = reference_input_logprobs(hf_model, prompts[3], 1, temperature=0.5)
    got = [lp for lp, _, _ in r["meta_info"]["input_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4


def test_text_input_and_batch_rids(client, tokenizer):
    r = client.generate({"text": "12+34=", "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert r["meta_info"]["prompt_tokens"] == len(tokenizer.encode("12+34="))
    rs = client.generate(
        {
            "text": ["1+2=", "3+4="],
            "rid": ["a", "b"],
            "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True},
        }
    )
    assert [x["meta_info"]["id"] for x in rs] == ["a", "b"]
    assert all(len(x["output_ids"]) == 2 for x in rs)


def test_bad_requests_answer_400_and_server_keeps_working(engine, client, prompts, tiny_model_dir):
    url = engine.url + "/generate"
    vocab = client.get_model_info()["vocab_size"]
    cases = [
        (b"{not json", "not valid JSON"),
        ({"input_ids": prompts[0], "sampling_params": {"temprature": 1.0}}, "temprature"),
        ({"input_ids": [1, vocab + 5]}, "token id"),
        ({"input_ids": [-1]}, "token id"),
        ({"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 100000}}, "context length"),
        ({"sampling_params": {}}, "exactly one of"),
        ({"input_ids": prompts[0], "text": "x"}, "exactly one of"),
        ({"input_ids": prompts[0], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": prompts[0], "sampling_params": {"stop_token_ids": [vocab]}}, "stop_token_ids"),
        ({"input_ids": prompts[0], "sampling_params": {"max_new_tokens": "ten"}}, "max_new_tokens"),
        ({"input_ids": [prompts[0], prompts[1]], "sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": prompts[0], "bogus": 1}, "bogus"),
        ({"input_ids": prompts[0], "stream": True}, "stream"),
        ({"input_ids": []}, "input_ids"),
    ]
    with httpx.Client(timeout=30) as h:
        for body, needle in cases:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            resp = h.post(url, content=content, headers={"content-type": "application/json"})
            assert resp.status_code == 400, (body, resp.text)
            msg = resp.json()["error"]["message"]
            assert needle in msg, (needle, msg)
    r = gen(client, prompts[0], max_new_tokens=3, temperature=0, ignore_eos=True)
    assert len(r["output_ids"]) == 3


def test_info_endpoints(engine, client, tiny_model_dir):
    assert client.health()
    with httpx.Client(timeout=30) as h:
        assert h.get(engine.url + "/health_generate").status_code == 200
        for path in ("/get_model_info", "/model_info"):
            info = h.get(engine.url + path).json()
            assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
            assert info["tokenizer_path"] == str(tiny_model_dir) and "weight_version" in info
        for path in ("/get_server_info", "/server_info"):
            info = h.get(engine.url + path).json()
            assert info["version"] and info["weight_version"] == "default" and info["port"] == engine.port
        load = h.get(engine.url + "/get_load").json()
        assert load["num_reqs"] == 0 and load["num_tokens"] == 0
    assert client.flush_cache()["success"] is True


def test_async_post_many_concurrent_and_errors(engine, prompts):
    from slime.utils.http_utils import HTTPRequestError, get, post

    async def run():
        payloads = [
            {
                "input_ids": prompts[i % len(prompts)],
                "sampling_params": {"max_new_tokens": 4, "temperature": 1.0},
                "return_logprob": True,
            }
            for i in range(64)
        ]
        outs = await asyncio.gather(*(post(engine.url + "/generate", p) for p in payloads))
        assert all(len(o["output_ids"]) >= 1 for o in outs)
        assert (await get(engine.url + "/get_model_info"))["is_generation"] is True
        with pytest.raises(HTTPRequestError, match="temprature") as ei:
            await post(engine.url + "/generate", {"input_ids": [1], "sampling_params": {"temprature": 1}})
        assert ei.value.status == 400
        with pytest.raises(HTTPRequestError, match="after 2 attempts"):
            await post("http://127.0.0.1:9/generate", {}, max_retries=2, retry_interval=0.01)

    asyncio.run(run())
    asyncio.run(run())  # a second event loop gets its own session


def test_rows_finishing_at_different_steps_match_single_runs(client, prompts):
    """Rows that finish early leave the running batch; the others must not notice."""
    lengths = [1, 9, 3, 14, 2, 6]
    sps = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in lengths]
    batch = client.generate({"input_ids": prompts, "sampling_params": sps, "return_logprob": True})
    for p, sp, b in zip(prompts, sps, batch, strict=True):
        single = client.generate({"input_ids": p, "sampling_params": sp, "return_logprob": True})
        assert b["output_ids"] == single["output_ids"] and len(b["output_ids"]) == sp["max_new_tokens"]
        diff = max(
            abs(x[0] - y[0])
            for x, y in zip(
                b["meta_info"]["output_token_logprobs"], single["meta_info"]["output_token_logprobs"], strict=True
            )
        )
        assert diff < 1e-4
