"""Continuous batching: a request that arrives while a batch decodes joins it between decode steps,
finishes before the long one, and gets exactly what it would get alone (greedy = HF forward).
Run with both forward implementations: the native slot pool and the HF forward's padded cache."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from engine_test_utils import reference_greedy, reference_logprobs, start_engine

from slime.engine.client import EngineClient

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=["native", "transformers"])
def engine(request, tiny_model_dir, tmp_path_factory):
    eng = start_engine(
        tiny_model_dir, "--step-delay-ms", "5", "--model-impl", request.param, log_dir=tmp_path_factory.mktemp("cb_log")
    )
    with EngineClient(eng.url, timeout=60) as c:
        assert c.get_model_info()["model_impl"] == request.param
    yield eng
    eng.stop()


def test_late_requests_join_the_running_batch(engine, hf_model, tokenizer):
    long_p = tokenizer.encode("What is 99+9? Let's think step by step.")
    short = [tokenizer.encode(t) for t in ("12+34=", "7+5=", "The answer is")]
    done_at = {}

    def run(name, body):
        with EngineClient(engine.url, timeout=60) as c:
            out = c.generate(body)
        done_at[name] = time.monotonic()
        return out

    def body(p, n):
        return {
            "input_ids": p,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        }

    with EngineClient(engine.url, timeout=60) as c:
        batches0 = c.get_server_info()["stats"]["batches_run"]
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            f_long = ex.submit(run, "long", body(long_p, 150))
            deadline = time.monotonic() + 10
            while c.get_load()["num_running_reqs"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            time.sleep(0.1)  # the long request is decoding now
            f_short = [ex.submit(run, f"s{i}", body(p, 6)) for i, p in enumerate(short)]
            outs = [f.result() for f in f_short]
            long_out = f_long.result()
        batches = c.get_server_info()["stats"]["batches_run"] - batches0
    assert all(done_at[f"s{i}"] < done_at["long"] for i in range(len(short)))
    assert batches == 1, "the short requests should have joined the running batch"
    for p, o in zip(short + [long_p], outs + [long_out], strict=True):
        n = len(o["output_ids"])
        assert o["output_ids"] == reference_greedy(hf_model, p, n)
        lps = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
        assert (
            max(abs(a - b) for a, b in zip(lps, reference_logprobs(hf_model, p, o["output_ids"], 0.0), strict=True))
            < 1e-4
        )
