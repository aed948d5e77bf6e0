"""The engine's native forward (slot KV pool, C kernels or torch ops) against the model's own HF
forward, step by step: prefill with duplicates and prompt logits, decode, rows leaving in any
order, rows joining a running batch, prefix-cache hits, pool growth. Llama, Qwen2 and Qwen3
shapes, several GQA groupings, fp32 and bf16."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from slime.engine.hf_forward import HFForward
from slime.engine.kernels import load
from slime.engine.model_runner import column_major_linears
from slime.engine.native_forward import NativeForward, has_bf16_matmul, native_unsupported
from slime.engine.prefix_cache import PrefixCache
from slime.engine.running_batch import compaction_order

VOCAB = 97


def make_model(kind: str, heads: int = 4, kv_heads: int = 2, hidden: int = 64, seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden + 8,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        tie_word_embeddings=kind != "llama",
    )
    cfg = {
        "llama": lambda: LlamaConfig(**common, attention_bias=True),
        "qwen2": lambda: Qwen2Config(**common),
        "qwen3": lambda: Qwen3Config(**common, head_dim=2 * hidden // heads),
    }[kind]()
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so every parameter matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn(p.shape))
    return model


def forwards(model, dtype=torch.float32, use_kernels=True, widen=None):
    model = model.to(dtype)
    native_model = copy.deepcopy(model)
    column_major_linears(native_model)  # as the engine loads it: same values, other memory order
    return (
        NativeForward(native_model, dtype, 128, use_kernels=use_kernels, widen=widen),
        HFForward(model, pad_token_id=0),
    )


def script(fwd, cache: PrefixCache | None = None):
    """One scripted batch life; returns every logits tensor the forward produced."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 11, 3, 11, 8)]
    prompts[3] = list(prompts[1])  # a shared prompt (prefilled once, KV copied)
    out = []
    batch = fwd.new_batch()
    last, full, cached = fwd.add_rows(batch, prompts, 3, True, {}, True)
    out += [last, *full]
    assert cached == [0, 0, 0, len(prompts[1]), 0]
    tokens = last.argmax(-1)
    for step in range(8):
        logits = fwd.decode(batch, tokens)
        out.append(logits)
        tokens = logits.argmax(-1)
        if step == 2:  # row 1 finishes; the last row moves into its slot
            keep = compaction_order([True, False, True, True, True])
            assert keep == [0, 4, 2, 3]
            fwd.select_rows(batch, keep)
            tokens = tokens[keep]
        if step == 4:  # two requests join the running batch, one of them long
            joining = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (30, 2)]
            hits = {}
            if cache is not None:
                m, entry = cache.match(joining[0])
                hits = {0: (m, entry)} if entry is not None else {}
            new_last, _, new_cached = fwd.add_rows(batch, joining, 20, False, hits, True)
            out.append(new_last)
            if hits:
                assert new_cached[0] == hits[0][0]
            tokens = torch.cat([tokens, new_last.argmax(-1)])
    return out


@pytest.mark.parametrize("kind,heads,kv_heads", [("qwen2", 4, 2), ("llama", 4, 4), ("qwen3", 4, 1), ("llama", 8, 2)])
@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "torch"])
def test_native_matches_hf_forward(kind, heads, kv_heads, use_kernels):
    native, hf = forwards(make_model(kind, heads, kv_heads), use_kernels=use_kernels)
    if use_kernels:
        assert (native.kernels is not None) == (load() is not None)
    else:
        assert native.kernels is None
    for a, b in zip(script(native), script(hf), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("widen", [True, False], ids=["fp32-projections", "bf16-projections"])
@pytest.mark.parametrize("use_kernels", [True, False], ids=["attention-kernel", "torch"])
def test_native_matches_hf_forward_bf16(widen, use_kernels):
    native, hf = forwards(make_model("qwen2"), dtype=torch.bfloat16, use_kernels=use_kernels, widen=widen)
    assert (native.wide is not None) == widen
    # bf16 projections with the C kernels on a CPU with bf16 units: fp32 between the projections
    mixed = not widen and use_kernels and has_bf16_matmul() and load() is not None
    assert native.mixed == mixed and (native.kernels is not None) == mixed
    assert (native.packed is not None) == mixed  # the projections on oneDNN's prepacked bf16 weights
    if not use_kernels:
        assert native.attention_kernel is None
    for a, b in zip(script(native), script(hf), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0.1)  # logits of size ~4: a few bf16 ulps


@pytest.mark.skipif(not has_bf16_matmul() or load() is None, reason="needs a CPU with bf16 units and the C kernels")
def test_mixed_bf16_is_closer_to_fp32_than_hfs_bf16():
    """The mixed step (bf16 projections, fp32 between them) rounds only the projections' inputs and
    outputs: nearer the fp32 forward of the same bf16 weights than HF's all-bf16 forward is."""
    model = make_model("qwen2").to(torch.bfloat16)
    mixed, hf_bf16 = forwards(copy.deepcopy(model), dtype=torch.bfloat16, widen=False)
    _, hf_fp32 = forwards(copy.deepcopy(model), dtype=torch.float32)
    assert mixed.mixed
    exact = script(hf_fp32)
    err_mixed = max(float((a - b).abs().max()) for a, b in zip(script(mixed), exact, strict=True))
    err_hf = max(float((a - b).abs().max()) for a, b in zip(script(hf_bf16), exact, strict=True))
    assert err_mixed < err_hf


@pytest.mark.parametrize("widen", [True, False], ids=["fp32-projections", "bf16-projections"])
def test_widened_projections_follow_weight_updates(widen):
    """The copies of a bf16 model's weights (fp32 ones of every weight when widened; on a CPU with
    bf16 units the prepacked bf16 projections and the norms' fp32 copies) are rebuilt when a weight
    changes in place (a weight sync) or is replaced: the next step equals a fresh forward over the
    new weights, bit for bit."""
    model = make_model("qwen2").to(torch.bfloat16)
    native = NativeForward(model, torch.bfloat16, 128, widen=widen)
    fresh = lambda: NativeForward(copy.deepcopy(model), torch.bfloat16, 128, widen=widen)  # noqa: E731

    def logits(fwd):
        return fwd.add_rows(fwd.new_batch(), [[3, 4, 5, 6]], 2, False, {}, True)[0]

    before = logits(native)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(-1.5)  # in place, as load_named_tensors copies
        model.model.layers[1].self_attn.q_proj.bias.add_(0.5)
        model.model.layers[1].post_attention_layernorm.weight.mul_(0.5)
    after = logits(native)
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, logits(fresh()), rtol=0, atol=0)
    with torch.no_grad():
        proj = model.model.layers[1].mlp.down_proj
        proj.weight.data = (proj.weight.data * 0.5).contiguous()  # storage replaced
    replaced = logits(native)
    assert not torch.equal(after, replaced)
    torch.testing.assert_close(replaced, logits(fresh()), rtol=0, atol=0)


def test_prefix_cache_hit_equals_full_prefill():
    """A joining prompt that starts with a finished row's tokens reuses that row's KV; the logits
    are those of prefilling everything."""
    model = make_model("qwen2")
    native, _ = forwards(model)
    cache = PrefixCache(4096, min_match=8)
    batch = native.new_batch()
    g = torch.Generator().manual_seed(7)
    history = torch.randint(1, VOCAB, (24,), generator=g).tolist()
    native.add_rows(batch, [history], 2, False, {}, True)
    cache.insert(history, *native.row_kv(batch, 0, len(history)))
    prompt = history + [5, 6, 7]
    m, entry = cache.match(prompt)
    assert m == 24
    with_hit, _, cached = native.add_rows(native.new_batch(), [prompt], 2, False, {0: (m, entry)}, True)
    assert cached == [24]
    plain, _, _ = native.add_rows(native.new_batch(), [prompt], 2, False, {}, True)
    torch.testing.assert_close(with_hit, plain, rtol=0, atol=1e-5)
    ref = model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(with_hit[0], ref, rtol=0, atol=1e-5)


def test_pool_grows_past_its_capacity():
    """Rows decoding past the capacity reserved at prefill (a retracted row re-prefilled with a
    smaller max_new_tokens, say) grow the pool and keep their KV."""
    native, hf = forwards(make_model("qwen2"))
    outs, batches = [], []
    for fwd in (native, hf):
        batch = fwd.new_batch()
        last, _, _ = fwd.add_rows(batch, [[3, 4, 5], [9, 8, 7, 6]], 1, False, {}, True)
        if fwd is native:
            reserved = batch.pool.capacity
        seq, tok = [last], last.argmax(-1)
        for _ in range(60):
            lg = fwd.decode(batch, tok)
            seq.append(lg)
            tok = lg.argmax(-1)
        outs.append(seq)
        batches.append(batch)
    assert reserved < 64 <= batches[0].pool.capacity and batches[0].max_len == 64
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


def test_unsupported_models_say_why():
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert "model_type 'gpt2'" in native_unsupported(gpt2)
    windowed = MistralForCausalLM(
        MistralConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=16,
        )
    )
    assert "sliding_window" in native_unsupported(windowed)
    assert native_unsupported(make_model("qwen2")) is None


def test_compaction_order_moves_only_tail_rows():
    assert compaction_order([True, True, True]) == [0, 1, 2]
    assert compaction_order([False, True, True, False, True]) == [4, 1, 2]
    assert compaction_order([False, False, True]) == [2]
    assert compaction_order([True, False, False, False]) == [0]
