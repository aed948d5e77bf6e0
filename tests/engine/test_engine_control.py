"""Control endpoints against a real server: abort, pause/continue, memory release, weight updates.

The server here sleeps 10 ms after every decode step (--step-delay-ms), so a long generation is
reliably still running when the test interrupts it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import time

import httpx
import pytest
import torch
from engine_test_utils import reference_greedy, reference_logprobs, start_engine

from slime.engine.client import EngineClient
from slime.utils.http_utils import HTTPRequestError

pytestmark = pytest.mark.timeout(120)

TEXTS = ["12+34=", "7+5=", "The answer is", "What is 99+9?"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    # disk loads come from the tests' own temporary directories only
    eng = start_engine(
        tiny_model_dir,
        "--step-delay-ms",
        "10",
        "--weight-load-dirs",
        str(tmp_path_factory.getbasetemp()),
        log_dir=tmp_path_factory.mktemp("ctl_log"),
    )
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(t) for t in TEXTS]


@pytest.fixture()
def pool():
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        yield ex


def background(pool, url, body):
    def run():
        with EngineClient(url, timeout=60) as c:
            return c.generate(body)

    return pool.submit(run)


def wait_running(client, n=1, timeout=10.0, total=1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = client.get_load()
        if load["num_running_reqs"] >= n and load["num_reqs"] >= total and load["num_tokens"] > 0:
            return load
        time.sleep(0.01)
    raise AssertionError(f"no running requests after {timeout}s: {client.get_load()}")


def long_body(prompts, n=200, **kw):
    return {
        "input_ids": prompts,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw},
    }


def greedy(client, prompts, n=8):
    rs = client.generate(
        {
            "input_ids": prompts,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        }
    )
    return [r["output_ids"] for r in rs], rs


# ----------------------------------------------------------------------------------- aborts
def test_abort_all_returns_partial_output(engine, client, prompts, pool):
    fut = background(pool, engine.url, long_body(prompts))
    wait_running(client)
    time.sleep(0.1)
    t0 = time.monotonic()
    client.abort_all()
    results = fut.result(timeout=10)
    assert time.monotonic() - t0 < 2.0
    for r in results:
        m = r["meta_info"]
        assert m["finish_reason"]["type"] == "abort"
        assert 1 <= m["completion_tokens"] < 200
        assert len(r["output_ids"]) == m["completion_tokens"] == len(m["output_token_logprobs"])
    assert client.get_load()["num_reqs"] == 0
    ok = client.generate({"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 2}})
    assert ok["meta_info"]["finish_reason"]["type"] in ("length", "stop")


def test_abort_one_rid(engine, client, prompts, pool):
    kill = background(pool, engine.url, {**long_body(prompts[0]), "rid": "kill"})
    keep = background(pool, engine.url, {**long_body(prompts[1], n=30), "rid": "keep"})
    wait_running(client, total=2)  # one runs, the other waits for the next batch (or both run)
    client.abort("kill")
    assert kill.result(timeout=10)["meta_info"]["finish_reason"]["type"] == "abort"
    r = keep.result(timeout=10)
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 30}


# ----------------------------------------------------------------------------------- pauses
@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_and_continue_keeps_greedy_output(engine, client, prompts, pool, mode):
    expected, _ = greedy(client, prompts[:2], n=40)
    fut = background(pool, engine.url, long_body(prompts[:2], n=40))
    wait_running(client)
    client.pause_generation(mode)
    time.sleep(0.05)
    n1 = client.get_load()["num_tokens"]
    time.sleep(0.3)
    assert client.get_load()["num_tokens"] == n1  # frozen
    assert not fut.done()
    client.continue_generation()
    results = fut.result(timeout=10)
    assert [r["output_ids"] for r in results] == expected
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)


def test_pause_abort_mode_then_new_requests_wait(engine, client, prompts, pool):
    fut = background(pool, engine.url, long_body(prompts[0]))
    wait_running(client)
    client.pause_generation()  # SGLang's default mode: abort
    assert fut.result(timeout=10)["meta_info"]["finish_reason"]["type"] == "abort"
    waiting = background(pool, engine.url, long_body(prompts[0], n=3))
    time.sleep(0.3)
    assert not waiting.done() and client.get_load()["num_waiting_reqs"] == 1
    client.continue_generation()
    assert waiting.result(timeout=10)["meta_info"]["finish_reason"]["type"] == "length"


def test_release_memory_makes_generation_wait(engine, client, prompts, pool):
    client.release_memory_occupation()
    assert client.get_server_info()["memory_released"] is True
    fut = background(pool, engine.url, long_body(prompts[0], n=3))
    time.sleep(0.3)
    assert not fut.done()
    client.resume_memory_occupation()
    assert len(fut.result(timeout=10)["output_ids"]) == 3


# ----------------------------------------------------------------------------------- weights
@pytest.fixture(scope="module")
def ref_model(hf_model):
    return copy.deepcopy(hf_model)


def assert_matches_reference(client, model, prompts, version=None):
    outs, rs = greedy(client, prompts)
    for p, o, r in zip(prompts, outs, rs, strict=True):
        assert o == reference_greedy(model, p, len(o))
        got = [lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]]
        want = reference_logprobs(model, p, o, 0.0)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
        if version is not None:
            assert r["meta_info"]["weight_version"] == version
    return outs


def test_update_weights_from_tensor_subset(client, ref_model, prompts):
    before, _ = greedy(client, prompts)
    sd = ref_model.state_dict()
    g = torch.Generator().manual_seed(1)
    upd = {
        "model.embed_tokens.weight": sd["model.embed_tokens.weight"]
        + 0.5 * torch.randn(sd["model.embed_tokens.weight"].shape, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(sd["model.layers.0.mlp.up_proj.weight"].shape, generator=g),
    }
    resp = client.update_weights_from_tensor(upd, weight_version="v1")
    assert resp["success"] is True and resp["weight_version"] == "v1"
    with torch.no_grad():
        for n, t in upd.items():
            sd[n].copy_(t)
    after = assert_matches_reference(client, ref_model, prompts, version="v1")
    assert after != before
    assert client.get_model_info()["weight_version"] == "v1"
    # the tied head, updated through its own name, moves the embedding with it
    head = {"lm_head.weight": torch.randn(sd["lm_head.weight"].shape, generator=g)}
    client.update_weights_from_tensor(head)
    with torch.no_grad():
        sd["lm_head.weight"].copy_(head["lm_head.weight"])
    assert torch.equal(sd["model.embed_tokens.weight"], head["lm_head.weight"])
    assert_matches_reference(client, ref_model, prompts)


def test_bad_weight_update_changes_nothing(engine, client, ref_model, prompts):
    before, _ = greedy(client, prompts)
    version = client.get_model_info()["weight_version"]
    sd = ref_model.state_dict()
    good = {"model.norm.weight": torch.zeros_like(sd["model.norm.weight"])}
    with pytest.raises(HTTPRequestError, match="shape") as ei:
        client.update_weights_from_tensor({**good, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)})
    assert ei.value.status == 400
    with pytest.raises(HTTPRequestError, match="unknown") as ei:
        client.update_weights_from_tensor({**good, "model.layers.9.nope.weight": torch.zeros(3)})
    assert ei.value.status == 400
    with httpx.Client(timeout=30) as h:
        resp = h.post(
            engine.url + "/update_weights_from_tensor",
            json={"serialized_named_tensors": [base64.b64encode(b"garbage").decode()]},
        )
        assert resp.status_code == 400 and "decode" in resp.json()["error"]["message"]
        resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": "/nonexistent/dir"})
        assert resp.status_code == 403  # not under --weight-load-dirs
        missing = str(engine.log_path.parent.parent / "nonexistent")
        resp = h.post(engine.url + "/update_weights_from_disk", json={"model_path": missing})
        assert resp.status_code == 400
    assert greedy(client, prompts)[0] == before
    assert client.get_model_info()["weight_version"] == version


def test_update_weights_from_disk(client, ref_model, prompts, tmp_path):
    new = copy.deepcopy(ref_model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    new.save_pretrained(tmp_path)
    before, _ = greedy(client, prompts)
    resp = client.update_weights_from_disk(str(tmp_path))
    assert resp["success"] is True
    after = assert_matches_reference(client, new, prompts, version=resp["weight_version"])
    assert after != before
    assert client.get_model_info()["model_path"] == str(tmp_path)


def test_weight_update_waits_for_running_batch(engine, client, prompts, pool, ref_model):
    """An update arriving mid-generation is applied after the batch: the batch is all old weights."""
    expected, _ = greedy(client, prompts[:1], n=40)
    fut = background(pool, engine.url, long_body(prompts[:1], n=40))
    wait_running(client)
    sd = ref_model.state_dict()
    client.update_weights_from_tensor({"model.norm.weight": sd["model.norm.weight"] * 3.0})
    r = fut.result(timeout=10)
    assert [x["output_ids"] for x in r] == expected


def test_control_calls_while_paused_in_place_do_not_deadlock(engine, client, prompts, pool, ref_model):
    fut = background(pool, engine.url, long_body(prompts[:2], n=60))
    wait_running(client)
    client.pause_generation("in_place")
    sd = ref_model.state_dict()
    t0 = time.monotonic()
    # flush_cache=True: the frozen batch is retracted (KV dropped), then the weights change
    client.update_weights_from_tensor({"model.norm.weight": sd["model.norm.weight"] * 0.5})
    client.flush_cache()
    client.release_memory_occupation()
    assert time.monotonic() - t0 < 5
    assert not fut.done()
    client.resume_memory_occupation()
    client.continue_generation()
    results = fut.result(timeout=10)
    assert all(r["meta_info"]["finish_reason"] == {"type": "length", "length": 60} for r in results)
    assert all(len(r["meta_info"]["output_token_logprobs"]) == 60 for r in results)
