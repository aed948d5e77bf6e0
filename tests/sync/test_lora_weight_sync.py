"""Adapter-only weight sync of a LoRA policy against a real engine server process: the engine
keeps the base weights, merges each adapter it receives, and then serves the very weights a
full sync of the trainer's merge gives (identical log-probs, bit for bit), over shared memory and
over the gloo broadcast (in buckets that split modules); the base goes once; an engine without
it refuses an adapter alone (409); bad adapters are refused naming the module."""

from __future__ import annotations

import copy
from argparse import Namespace

import pytest
import torch

from slime.backends.torch import lora
from slime.engine.client import EngineClient
from slime.engine.lora_weights import LoraBase, LoraRequest, LoraUpdateError
from slime.sync.distributed import DistributedWeightSync
from slime.sync.shm import SharedMemoryWeightSync
from slime.sync.tensor import engine_sequence_log_probs
from slime.utils.http_utils import HTTPRequestError
from slime.utils.lora_merge import merge_weight
from tests.engine.engine_test_utils import reference_logprobs

pytestmark = pytest.mark.timeout(200)

SEQ = list(range(5, 40))


@pytest.fixture(scope="module")
def policy(hf_model):
    """The tiny model with a rank-4 adapter on every linear layer, trained two AdamW steps (B != 0)."""
    m = copy.deepcopy(hf_model).train()
    args = Namespace(
        lora_rank=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["all-linear"],
        lora_exclude_modules=[], lora_adapter_path=None, seed=3, bf16=False, fp16=False,
    )  # fmt: skip
    lora.apply(m, args)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.tensor([SEQ[:20], SEQ[10:30]])

    def step():
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        return {k: v.detach().clone() for k, v in m.state_dict().items()}

    return m, step


def engine_logprobs(url: str) -> list[float]:
    return engine_sequence_log_probs(url, SEQ)


def lora_field(model, base_id: str, with_base: bool) -> dict:
    return {
        "scaling": lora.scaling(model),
        "base_id": base_id,
        "base": with_base,
        "modules": lora.adapted_modules(model),
    }


def with_base(raw: dict) -> dict:
    return {**lora.base_view(raw), **lora.engine_adapter(raw)}


@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-base"])
def test_the_engine_merge_is_the_trainers_bit_for_bit(policy, base_dtype):
    """bf16-base: a --bf16 LoRA trainer keeps its base weights in bf16 and sends them so; both sides'
    merges give fp32 weights (the adapter's dtype), the same bits."""
    model, step = policy
    raw = step()
    raw = {k: v.to(base_dtype) if ".base_layer.weight" in k else v for k, v in raw.items()}
    req = LoraRequest.parse({"lora": lora_field(model, "b1", True)})
    got = LoraBase().expand(with_base(raw), req, closing=True)
    want = lora.merged(raw, lora.scaling(model))
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert {got[f"{m}.weight"].dtype for m in lora.adapted_modules(model)} == {torch.float32}
    # and the merge is the formula, computed independently in float64
    k = "model.layers.0.mlp.down_proj"
    ref = raw[f"{k}.base_layer.weight"].double() + lora.scaling(model) * (
        raw[f"{k}.lora_B.default.weight"].double() @ raw[f"{k}.lora_A.default.weight"].double()
    )
    assert (got[f"{k}.weight"].double() - ref).abs().max() < 1e-6
    assert not torch.equal(got[f"{k}.weight"], raw[f"{k}.base_layer.weight"])  # B moved


def test_merge_weight_does_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(0)
    w, a, b = torch.randn(384, 256, generator=g), torch.randn(16, 256, generator=g), torch.randn(384, 16, generator=g)
    before = torch.get_num_threads()
    outs = []
    for n in (1, 2):
        torch.set_num_threads(n)
        outs.append(merge_weight(w, a, b, 0.5))
    torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.get_num_threads() == before


def test_shared_memory_adapter_sync_serves_the_merged_weights(engine, policy):
    model, step = policy
    client = EngineClient(engine.url)
    shm = SharedMemoryWeightSync()
    try:
        raw = step()
        full_bytes = shm.push([engine.url], lora.merged(raw, lora.scaling(model)), weight_version="m1")
        after_full = engine_logprobs(engine.url)
        assert client.get_server_info()["lora_base_id"] is None
        # first adapter sync: the base goes along
        shm.push([engine.url], with_base(raw), weight_version="a1", lora=lora_field(model, "run1", True))
        assert client.get_server_info()["lora_base_id"] == "run1"
        assert client.get_weight_version() == "a1"
        assert engine_logprobs(engine.url) == after_full  # the same weights, bit for bit
        # then the adapter alone
        raw = step()
        adapter = lora.engine_adapter(raw)
        adapter_bytes = shm.push([engine.url], adapter, weight_version="a2", lora=lora_field(model, "run1", False))
        after_adapter = engine_logprobs(engine.url)
        assert after_adapter != after_full
        assert (torch.tensor(after_adapter) - reference_logprobs_of(model, raw)).abs().max() < 1e-4
        shm.push([engine.url], lora.merged(raw, lora.scaling(model)), weight_version="m2")
        assert engine_logprobs(engine.url) == after_adapter
        assert adapter_bytes < 0.2 * full_bytes  # rank 4 on a tiny model: the adapter is a small part
        # a plain update replaced the weights: the base is gone, an adapter alone is refused (409)
        assert client.get_server_info()["lora_base_id"] is None
        with pytest.raises(HTTPRequestError, match=r"409.*holds no base weights for adapter base 'run1'"):
            shm.push([engine.url], adapter, weight_version="a3", lora=lora_field(model, "run1", False))
        assert client.get_weight_version() == "m2"
    finally:
        shm.close()


@torch.no_grad()
def reference_logprobs_of(model, raw) -> torch.Tensor:
    """A plain transformers model holding the trainer's merge: its log-probs of SEQ[1:]."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(model.config).eval()
    plain.load_state_dict(lora.merged(raw, lora.scaling(model)))
    return torch.tensor(reference_logprobs(plain, SEQ[:1], SEQ[1:], 1.0))


def test_bucketed_broadcast_adapter_sync(engine, policy):
    model, step = policy
    raw = step()
    group = DistributedWeightSync(buffer_size=4096)  # buckets of a few tensors: modules split across calls
    try:
        group.push([engine.url], lora.merged(raw, lora.scaling(model)), weight_version="d0")
        want = engine_logprobs(engine.url)
        sent = group.push([engine.url], with_base(raw), weight_version="d1", lora=lora_field(model, "run2", True))
        assert engine_logprobs(engine.url) == want
        raw = step()
        small = group.push(
            [engine.url], lora.engine_adapter(raw), weight_version="d2", lora=lora_field(model, "run2", False)
        )
        got = engine_logprobs(engine.url)
        group.push([engine.url], lora.merged(raw, lora.scaling(model)), weight_version="d3")
        assert engine_logprobs(engine.url) == got != want
        assert small < sent / 5
    finally:
        group.close()


def test_bad_adapters_are_refused_naming_the_module(engine, policy):
    model, step = policy
    raw = step()
    shm = SharedMemoryWeightSync()
    try:
        state = with_base(raw)
        name = "model.layers.1.self_attn.o_proj.lora_A.weight"
        state[name] = torch.zeros(state[name].shape[0], state[name].shape[1] + 1)
        with pytest.raises(HTTPRequestError, match=r"model\.layers\.1\.self_attn\.o_proj: A \(4, 65\)"):
            shm.push([engine.url], state, weight_version="bad", lora=lora_field(model, "run3", True))
        state = with_base(raw)
        field = lora_field(model, "run3", True)
        field["modules"] = field["modules"][1:]
        with pytest.raises(HTTPRequestError, match=r"is not in lora\.modules"):
            shm.push([engine.url], state, weight_version="bad", lora=field)
        field = lora_field(model, "run3", True)
        field["scaling"] = "big"
        with pytest.raises(HTTPRequestError, match=r"lora\.scaling must be a finite number"):
            shm.push([engine.url], state, weight_version="bad", lora=field)
        assert EngineClient(engine.url).get_server_info()["lora_base_id"] is None
    finally:
        shm.close()


def test_an_update_missing_a_module_is_refused():
    base = LoraBase()
    w = {"m.weight": torch.zeros(3, 2), "m.lora_A.weight": torch.zeros(1, 2)}  # no B
    req = LoraRequest(scaling=1.0, base_id="x", with_base=True, modules=["m"])
    with pytest.raises(LoraUpdateError, match="1 module\\(s\\) incomplete"):
        base.expand(w, req, closing=True)
    assert base.base_id is None


def test_the_trainer_sends_the_base_once_and_merged_weights_where_adapters_cannot_go(engine, policy, monkeypatch):
    from types import SimpleNamespace

    from slime.backends.torch import sync_payload
    from tests.helpers import make_args

    model, step = policy
    step()
    args = make_args("--colocate")  # shared memory: adapter updates
    actor = SimpleNamespace(args=args, model=model, world_size=1, syncer=None, is_rank0=lambda: True)
    actor.adapter_sync = sync_payload.AdapterSync(model)
    p = sync_payload.payload(actor, [engine.url])  # this engine holds no base of this trainer
    assert p.lora == actor.adapter_sync.field(True) and p.metrics() == {"perf/weight_sync_lora_base": 1.0}
    assert "model.layers.0.self_attn.q_proj.weight" in p.state and "model.embed_tokens.weight" in p.state
    assert p.snapshot is None
    shm = SharedMemoryWeightSync()
    try:
        shm.push([engine.url], p.state, weight_version="t1", lora=p.lora)
        p = sync_payload.payload(actor, [engine.url])
        assert p.lora["base"] is False and all(".lora_" in k for k in p.state)
        assert len(p.state) == 2 * len(actor.adapter_sync.modules)
    finally:
        shm.close()
    # under --use-fault-tolerance the snapshot is the merged weights
    actor.args = make_args("--colocate", "--use-fault-tolerance")
    p = sync_payload.payload(actor, [engine.url])
    assert set(p.snapshot) == set(lora.merged(model.state_dict(), 1.0))
    # full disk versions carry the adapter; deltas (patching a whole local checkpoint) the merged weights
    disk = ["--update-weight-transport", "disk", "--update-weight-disk-dir", "/tmp/unused"]
    actor.args = make_args(*disk)
    assert sync_payload.payload(actor, [engine.url]).lora == actor.adapter_sync.field(False)
    actor.args = make_args(*disk, "--update-weight-mode", "delta", "--update-weight-local-checkpoint-dir", "/tmp/l")
    p = sync_payload.payload(actor, [engine.url])
    assert p.lora is None and "model.layers.0.self_attn.q_proj.weight" in p.state and p.metrics() == {}
    # an engine that knows no adapter updates (SGLang's /server_info has no lora_base_id): merged
    actor.args = make_args("--colocate")
    monkeypatch.setattr(
        sync_payload, "client_for", lambda url: SimpleNamespace(get_server_info=lambda: {"version": "0.5"})
    )
    p = sync_payload.payload(actor, [engine.url])
    assert p.lora is None and not any(".lora_" in k for k in p.state)
