"""The KV token budget (--max-total-tokens / --mem-fraction-static): admission control keeps the
running batch's padded cache within it, every request is still answered, and a request that
could never fit is refused with a 400."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from engine_test_utils import start_engine

from slime.engine.args import build_arg_parser
from slime.engine.model_runner import ModelRunner
from slime.engine.state import kv_token_budget

BUDGET = 100
NEED = 25  # 5 prompt tokens + 20 new: at most 4 rows fit (4 x 25 = 100)


@pytest.fixture(scope="module")
def budget_engine(tiny_model_dir, tmp_path_factory):
    eng = start_engine(
        tiny_model_dir,
        "--max-total-tokens",
        str(BUDGET),
        "--step-delay-ms",
        "5",
        log_dir=tmp_path_factory.mktemp("log"),
    )
    yield eng
    eng.stop()


def _gen(ids, n_new):
    return {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": n_new, "ignore_eos": True, "temperature": 1.0},
        "return_logprob": True,
    }


@pytest.mark.e2e
def test_admission_keeps_the_batch_within_the_budget(budget_engine):
    info = httpx.get(budget_engine.url + "/get_server_info").json()
    assert info["max_total_num_tokens"] == BUDGET

    async def many():
        async with httpx.AsyncClient(timeout=120) as c:
            rs = await asyncio.gather(
                *(c.post(budget_engine.url + "/generate", json=_gen([3, 4, 5, 6, 7 + k], 20)) for k in range(12))
            )
            return [r.json() for r in rs]

    outs = asyncio.run(many())
    assert all(o["meta_info"]["completion_tokens"] == 20 for o in outs)  # all answered, in full
    stats = httpx.get(budget_engine.url + "/get_server_info").json()["stats"]
    assert stats["peak_kv_tokens"] <= BUDGET and stats["peak_running_requests"] == BUDGET // NEED
    assert httpx.get(budget_engine.url + "/get_load").json()["token_usage"] == 0.0  # empty again


@pytest.mark.e2e
def test_request_larger_than_the_budget_is_refused(budget_engine):
    r = httpx.post(budget_engine.url + "/generate", json=_gen([3, 4, 5], BUDGET))
    assert r.status_code == 400 and "KV token budget 100" in r.text
    assert httpx.post(budget_engine.url + "/generate", json=_gen([3, 4, 5], 4)).status_code == 200


def _engine_args(max_total_tokens, mem_fraction_static):
    """The engine's own arguments, parsed by its parser."""
    argv = ["--model-path", "unused"]
    if max_total_tokens is not None:
        argv += ["--max-total-tokens", str(max_total_tokens)]
    if mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(mem_fraction_static)]
    return build_arg_parser().parse_args(argv)


def test_mem_fraction_static_budget_follows_sglangs_rule(tiny_model_dir):
    """Budget = (fraction x machine memory - weight bytes) / KV bytes per token, computed here from
    the model's config and /proc/meminfo independently of the engine's code."""
    runner = ModelRunner(str(tiny_model_dir), dtype="float32")
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4
    mem = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    weights = sum(p.numel() * 4 for p in runner.model.parameters())
    args = _engine_args(None, 0.01)
    assert kv_token_budget(args, runner) == int((0.01 * mem - weights) // kv_per_token)
    assert kv_token_budget(_engine_args(64, 0.5), runner) == 64  # explicit wins
    assert kv_token_budget(_engine_args(None, None), runner) is None
    with pytest.raises(SystemExit, match="must be in"):
        kv_token_budget(_engine_args(None, 1.5), runner)
