"""The cross-request prefix cache: a multi-turn trajectory's next turn reuses the KV of the last
one (reported in cached_tokens), with the same tokens and log-probs as without the cache and as an
independent HF forward; weight updates and flush_cache clear it, so it never serves stale KV."""

from __future__ import annotations

import httpx
import pytest
from engine_test_utils import reference_logprobs, start_engine

# engine server processes
pytestmark = pytest.mark.e2e

PROMPT = [(7 * i + 3) % 200 + 20 for i in range(40)]


@pytest.fixture(scope="module")
def engines(tiny_model_dir, tmp_path_factory):
    on = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("on"))
    off = start_engine(tiny_model_dir, "--disable-radix-cache", log_dir=tmp_path_factory.mktemp("off"))
    yield on, off
    on.stop()
    off.stop()


def _gen(url, ids, n, temperature=0.0):
    r = httpx.post(
        url + "/generate",
        json={
            "input_ids": ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": temperature},
        },
        timeout=60,
    )
    r.raise_for_status()
    return r.json()


def _stats(url):
    return httpx.get(url + "/get_server_info", timeout=10).json()["stats"]["prefix_cache"]


def _turns(url, temperature=0.0):
    """Two turns of a trajectory: turn 2's prompt is turn 1's prompt + output + a tool's answer."""
    t1 = _gen(url, PROMPT, 16, temperature)
    history = PROMPT + t1["output_ids"] + [30, 31, 32, 33, 34, 35, 36, 37]
    return t1, history, _gen(url, history, 12, temperature)


def test_next_turn_reuses_the_history_and_matches_no_cache(engines, hf_model):
    on, off = engines
    httpx.post(on.url + "/flush_cache", timeout=30)
    t1_on, history, t2_on = _turns(on.url)
    t1_off, history_off, t2_off = _turns(off.url)
    assert t1_on["meta_info"]["cached_tokens"] == 0
    # turn 1's prompt and its output but the last token (whose KV was never computed) are reused
    assert t2_on["meta_info"]["cached_tokens"] == len(PROMPT) + 16 - 1
    assert t2_off["meta_info"]["cached_tokens"] == 0 and _stats(off.url) is None
    assert history == history_off and t2_on["output_ids"] == t2_off["output_ids"]
    lp_on = [x[0] for x in t2_on["meta_info"]["output_token_logprobs"]]
    lp_off = [x[0] for x in t2_off["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(lp_on, lp_off, strict=True)) < 1e-5
    # an independent forward over the whole sequence (temperature 0 reports T=1 log-probs)
    ref = reference_logprobs(hf_model, history, t2_on["output_ids"], 1.0)
    assert max(abs(a - b) for a, b in zip(ref, lp_on, strict=True)) < 1e-4
    assert _stats(on.url)["hits"] >= 1


def test_sampled_turns_in_a_batch_with_misses(engines):
    """Hits and misses prefilled in one batch (merged rows) give the answers of separate requests."""
    import asyncio

    on, _ = engines
    _, history, _ = _turns(on.url)
    fresh = [5, 6, 7, 8]

    async def both():
        async with httpx.AsyncClient(timeout=60) as c:
            body = {
                "input_ids": [history + [40], fresh, history + [41]],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0.0},
            }
            return (await c.post(on.url + "/generate", json=body)).json()

    batch = asyncio.run(both())
    assert [o["meta_info"]["cached_tokens"] > 0 for o in batch] == [True, False, True]
    httpx.post(on.url + "/flush_cache", timeout=30)
    single = [_gen(on.url, ids, 6) for ids in (history + [40], fresh, history + [41])]
    for b, s in zip(batch, single, strict=True):
        assert b["output_ids"] == s["output_ids"]
        diffs = [
            abs(x[0] - y[0])
            for x, y in zip(
                b["meta_info"]["output_token_logprobs"], s["meta_info"]["output_token_logprobs"], strict=True
            )
        ]
        assert max(diffs) < 1e-5


def test_flush_and_weight_updates_clear_the_cache(engines, tiny_model_dir):
    on, _ = engines
    _turns(on.url)
    assert _stats(on.url)["entries"] > 0
    httpx.post(on.url + "/flush_cache", timeout=30).raise_for_status()
    assert _stats(on.url)["entries"] == 0
    _turns(on.url)
    assert _stats(on.url)["entries"] > 0
    # same weights from disk: still a weight update, so nothing computed before it is reused
    r = httpx.post(on.url + "/update_weights_from_disk", json={"model_path": str(tiny_model_dir)}, timeout=60)
    r.raise_for_status()
    assert _stats(on.url)["entries"] == 0
    t1 = _gen(on.url, PROMPT, 16)
    assert t1["meta_info"]["cached_tokens"] == 0
