"""Prefix sharing: the n samples of one prompt are prefilled once, with identical results."""

from __future__ import annotations

import pytest
import torch
from engine_test_utils import reference_logprobs, start_engine

from slime.engine.client import EngineClient

# engine server processes
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def engines(tiny_model_dir, tmp_path_factory):
    shared = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("shared"))
    plain = start_engine(tiny_model_dir, "--disable-radix-cache", log_dir=tmp_path_factory.mktemp("plain"))
    yield shared, plain
    shared.stop()
    plain.stop()


def _batch(prompts, n, temperature):
    ids = [p for p in prompts for _ in range(n)]
    params = [
        {"temperature": temperature, "max_new_tokens": 10, "sampling_seed": i, "ignore_eos": True}
        for i in range(len(ids))
    ]
    return {"input_ids": ids, "sampling_params": params, "return_logprob": True}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sharing_gives_identical_tokens_and_logprobs(engines, hf_model, temperature):
    shared, plain = engines
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21]]
    a = EngineClient(shared.url).generate(_batch(prompts, 4, temperature))
    b = EngineClient(plain.url).generate(_batch(prompts, 4, temperature))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x["output_ids"] == y["output_ids"], i
        lx = torch.tensor([lp[0] for lp in x["meta_info"]["output_token_logprobs"]])
        ly = torch.tensor([lp[0] for lp in y["meta_info"]["output_token_logprobs"]])
        torch.testing.assert_close(lx, ly, rtol=0, atol=1e-5)
        ref = torch.tensor(reference_logprobs(hf_model, prompts[i // 4], x["output_ids"], temperature))
        torch.testing.assert_close(lx, ref, rtol=0, atol=1e-4)
    # the first of each group is prefilled, the other three reuse it
    assert [r["meta_info"]["cached_tokens"] for r in a] == [0, 6, 6, 6, 0, 3, 3, 3, 0, 8, 8, 8]
    assert all(r["meta_info"]["cached_tokens"] == 0 for r in b)
    if temperature > 0:  # different seeds: the samples of one prompt differ
        assert len({tuple(r["output_ids"]) for r in a[:4]}) > 1
