"""/init_weights_update_group + /update_weights_from_distributed against a real server process.

The test process plays the trainer (rank 0 of a gloo group on 127.0.0.1); after the broadcast
the engine must generate exactly what a direct HF forward with the new weights gives.
"""

from __future__ import annotations

import copy

import httpx
import pytest
import torch

from slime.engine.client import EngineClient
from slime.errors import SlimeError
from slime.sync.distributed import DistributedWeightSync
from tests.engine.engine_test_utils import reference_greedy, reference_logprobs, start_engine

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    eng = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("dist_log"))
    yield eng
    eng.stop()


def _perturbed(model, seed: int):
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m.eval()


def _check_engine_serves(client, model, prompts):
    for p in prompts:
        out = client.generate(
            {
                "input_ids": p,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            }
        )
        assert out["output_ids"] == reference_greedy(model, p, 8)
        lps = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
        ref = reference_logprobs(model, p, out["output_ids"], 0.0)
        assert max(abs(a - b) for a, b in zip(lps, ref, strict=True)) < 1e-4


def test_distributed_update_serves_new_weights(engine, hf_model, tokenizer):
    prompts = [tokenizer.encode(t) for t in ("12+34=", "7+5=", "The answer is")]
    with EngineClient(engine.url, timeout=60) as client:
        _check_engine_serves(client, hf_model, prompts)
        sync = DistributedWeightSync(buffer_size=20_000)  # several buckets (HTTP calls) per update
        try:
            for seed, version in ((1, "v1"), (2, "v2")):  # the second update reuses the group
                new = _perturbed(hf_model, seed)
                sync.push([engine.url], new.state_dict(), weight_version=version)
                assert client.get_model_info()["weight_version"] == version
                _check_engine_serves(client, new, prompts)
        finally:
            sync.close()
        # back to the original weights (a fresh group: the old one was destroyed)
        sync = DistributedWeightSync()
        try:
            sync.push([engine.url], hf_model.state_dict(), weight_version="orig")
        finally:
            sync.close()
        _check_engine_serves(client, hf_model, prompts)


def test_bad_distributed_requests_answer_400(engine, hf_model, tokenizer):
    prompts = [tokenizer.encode("7+5=")]
    url = engine.url
    cases = [
        (
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1234, "rank_offset": 1, "world_size": 2, "backend": "nccl"},
            "gloo",
        ),
        (
            "/init_weights_update_group",
            {"master_address": "127.0.0.1", "master_port": 1234, "rank_offset": 2, "world_size": 2},
            "rank_offset",
        ),
        ("/init_weights_update_group", {"master_port": 1234, "rank_offset": 1, "world_size": 2}, "master_address"),
        (
            "/update_weights_from_distributed",
            {"names": ["x"], "dtypes": ["float32"], "shapes": [[2]], "group_name": "nope"},
            "nope",
        ),
        ("/update_weights_from_distributed", {"names": ["x"], "dtypes": ["float31"], "shapes": [[2]]}, "float31"),
        (
            "/update_weights_from_distributed",
            {"names": ["x", "y"], "dtypes": ["float32"], "shapes": [[2]]},
            "equal lengths",
        ),
        ("/destroy_weights_update_group", {"group_name": "nope"}, "nope"),
    ]
    with httpx.Client(timeout=30) as h:
        for path, body, needle in cases:
            r = h.post(url + path, json=body)
            assert r.status_code == 400, (path, body, r.text)
            assert needle in r.json()["error"]["message"], (needle, r.text)

    # Unknown parameter names: the engine still drains the broadcast, answers 400, changes nothing,
    # and the trainer side raises SlimeError naming the problem.
    sync = DistributedWeightSync()
    try:
        with pytest.raises(SlimeError, match="unknown parameter"):
            sync.push([url], {"not.a.weight": torch.ones(3)}, weight_version="bad")
    finally:
        sync.close()
    with EngineClient(url, timeout=60) as client:
        assert client.get_model_info()["weight_version"] != "bad"
        _check_engine_serves(client, hf_model, prompts)
