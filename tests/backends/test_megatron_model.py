"""The policy as a real megatron-core GPTModel on the CPU (gloo): built from an HF checkpoint's config,
its weights converted from transformers', per-token log-probs equal to transformers' at tensor-parallel
sizes 1 and 2, the weights converted back exactly, and each CPU substitute shown necessary by
leaving it out."""

from __future__ import annotations

import os

import pytest
import torch

from slime.errors import SlimeError
from slime.utils.net import free_port
from tests.helpers import run_ranks

pytest.importorskip("megatron.core")

MODELS = {  # a tied Qwen2 (QKV bias) and an untied Llama (no bias, an output layer of its own)
    "qwen2_tied": dict(arch="qwen2"),
    "llama_untied": dict(arch="llama", tie_word_embeddings=False),
}


def _forward(model, hf, ids):
    """(Megatron's per-token log-probs via the vocab-parallel cross entropy, its logits gathered
    whole over the tensor-parallel ranks, transformers' log-probs and logits)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region, vocab_parallel_cross_entropy

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        logits = model(ids, positions, None)  # [b, s, vocab / tp]
        sbv = logits[:, :-1].transpose(0, 1).contiguous()
        lp = -vocab_parallel_cross_entropy(sbv, ids[:, 1:].transpose(0, 1).contiguous()).transpose(0, 1)
        full = gather_from_tensor_model_parallel_region(logits)
        ref_logits = hf(input_ids=ids).logits
        ref_lp = torch.log_softmax(ref_logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp, full, ref_lp, ref_logits


def _train_forward(config, hf, ids, world: int) -> None:
    """A training forward and backward with slime's scripts' block (sequence parallelism, every layer
    recomputed; the backward inside `cuda_calls_on_cpu`, as Megatron's schedule runs it here), then
    the same model frozen (a reference's forward)."""
    from megatron.core import parallel_state

    from slime.backends.megatron_utils import cpu_support, hf_weights, model_provider

    layout = model_provider.Layout(world, world > 1, "full", "uniform", 1)
    model = model_provider.build_gpt_model(config, layout).train()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    hf_weights.load_hf_weights(model, hf.state_dict(), tp_rank, world, config.tie_word_embeddings)
    ids = ids[:, :16]  # a multiple of the tensor-parallel size: the sequence is split over the ranks
    logits = model(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
    with cpu_support.cuda_calls_on_cpu():
        logits.float().square().mean().backward()
    with torch.no_grad():
        model.eval().requires_grad_(False)(ids, torch.arange(ids.shape[1]).expand_as(ids), None)


def _worker(rank: int, world: int, port: int, model_dirs: dict, out: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime.backends.megatron_utils import cpu_support, hf_weights, initialize, model_provider

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    installed = initialize.init_megatron(world, seed=1234)
    tp_rank, group = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_group()
    ids = torch.randint(5, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    results: dict = {"installed": installed}
    for name, path in model_dirs.items():
        config = AutoConfig.from_pretrained(path)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model = model_provider.build_gpt_model(config, model_provider.Layout(world)).eval()
        hf_weights.load_hf_weights(model, hf.state_dict(), tp_rank, world, config.tie_word_embeddings)
        lp, full, ref_lp, ref_logits = _forward(model, hf, ids)
        back = hf_weights.to_hf(dict(model.named_parameters()), model.config, world, group, config.tie_word_embeddings)
        expected = hf.state_dict()
        results[name] = {
            "lp_diff": float((lp - ref_lp).abs().max()),
            "logits_diff": float((full - ref_logits).abs().max()),
            "local_vocab": model.state_dict()["embedding.word_embeddings.weight"].shape[0],
            "same_names": sorted(back) == sorted(expected),
            "exact": all(torch.equal(back[k], expected[k]) for k in expected if k in back),
        }
    # each substitute left out in turn: a new model's forward, or the training forward and backward
    # with sequence parallelism and recomputation, fails (Megatron's CUDA-only code runs; a new model
    # and empty scratch buffers: both are kept after a first forward)
    without = {}
    for sub in cpu_support.SUBSTITUTES:
        cpu_support.restore(frozenset({sub.name}))
        parallel_state.get_global_memory_buffer().buffer.clear()  # allocated anew, as at the first forward
        try:
            _forward(model_provider.build_gpt_model(config, model_provider.Layout(world)).eval(), hf, ids)
            _train_forward(config, hf, ids, world)
            without[sub.name] = "ran"
        except Exception as e:  # noqa: BLE001 - recorded for the test to read
            without[sub.name] = f"{type(e).__name__}: {e}"
        cpu_support.apply()
    results["without"] = without
    if rank == 0:
        torch.save(results, f"{out}/megatron_{world}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from slime.data.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("megatron")
    dirs = {name: str(build_tiny_model(root / name, **kw)) for name, kw in MODELS.items()}
    out = {}
    for world in (1, 2):
        run_ranks(_worker, world, free_port(), dirs, str(root))
        out[world] = torch.load(root / f"megatron_{world}.pt", weights_only=False)
    return out


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_megatron_log_probs_are_transformers(runs, name, world):
    r = runs[world][name]
    assert r["local_vocab"] == 320 // world  # the vocabulary really is split over the ranks
    assert r["lp_diff"] < 1e-5 and r["logits_diff"] < 1e-5, r


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_weights_convert_back_exactly(runs, name, world):
    assert runs[world][name]["same_names"] and runs[world][name]["exact"]


def test_every_cpu_substitute_is_needed(runs):
    from slime.backends.megatron_utils import cpu_support

    assert runs[2]["installed"] == [s.name for s in cpu_support.SUBSTITUTES]
    for name, outcome in runs[2]["without"].items():
        assert "CUDA" in outcome or "cuda" in outcome, (name, outcome)


def test_an_untested_megatron_core_stops_with_the_version_to_install(monkeypatch):
    import megatron.core

    from slime.backends.megatron_utils import cpu_support

    monkeypatch.setattr(megatron.core, "__version__", "0.99.0")
    with pytest.raises(SlimeError, match=r"megatron-core 0.99.0 is installed; .* install megatron-core==0.16.1"):
        cpu_support.check_version()


def test_shapes_megatron_cannot_split_stop_naming_them(tmp_path):
    from transformers import AutoConfig

    from slime.backends.megatron_utils import model_provider
    from slime.data.tiny_model import build_tiny_model

    config = AutoConfig.from_pretrained(build_tiny_model(tmp_path / "m"))  # 4 heads, 2 key/value heads
    with pytest.raises(
        SlimeError, match="--tensor-model-parallel-size 4 must divide .* 4 attention heads and 2 key/value"
    ):
        model_provider.transformer_config(config, model_provider.Layout(4))
    config.model_type = "gpt2"
    with pytest.raises(SlimeError, match="model type 'gpt2' is not converted here"):
        model_provider.transformer_config(config, model_provider.Layout(1))


# ------------------------------------------------------------------------------ one optimizer step
OPT = dict(lr=1e-2, adam_eps=1e-2, clip_grad=1.0)  # eps: Adam's first step would be ~lr*sign(g) (float noise flips it)
TOKENS = torch.randint(5, 300, (4, 17), generator=torch.Generator().manual_seed(1))


def _nll(lp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return -lp.mean()


def _train_worker(rank: int, world: int, tp: int, distributed: bool, port: int, path: str, out: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime.backends.megatron_utils import initialize, model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    initialize.init_megatron(tp, seed=1234)
    config = AutoConfig.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    result: dict = {}
    if world == 1:  # the training machinery outside cuda_calls_on_cpu: Megatron's CUDA allocations
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        from slime.backends.megatron_utils import model_provider

        bare = model_provider.build_gpt_model(config, model_provider.Layout(1))
        try:
            DistributedDataParallel(bare.config, DistributedDataParallelConfig(), bare)
            result["bare_ddp"] = "ran"
        except Exception as e:  # noqa: BLE001 - recorded for the test to read
            result["bare_ddp"] = f"{type(e).__name__}: {e}"
    policy = model.build_policy(config, hf.state_dict(), model.OptimizerSettings(**OPT, distributed=distributed))
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    mine = TOKENS.chunk(dp)[dp_rank]  # this data-parallel rank's share of the global batch
    result.update(model.train_step(policy, list(mine.split(2)), _nll))
    result["state"] = model.hf_state(policy)
    result["optimizer"] = {
        type(o).__name__ for o in getattr(policy.optimizer, "chained_optimizers", [policy.optimizer])
    }
    result["split_marked"] = all(
        getattr(p, "tensor_model_parallel", False) for n, p in policy.model.named_parameters() if "linear_" in n
    )
    if rank == 0:
        torch.save(result, f"{out}/train_{world}_{tp}_{distributed}.pt")
    dist.destroy_process_group()


def _reference_step(path) -> dict:
    """The same step written out with transformers and torch: the loss averaged over the two
    micro-batches, clipping by the global norm, AdamW without weight decay."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    opt = torch.optim.AdamW(hf.parameters(), lr=OPT["lr"], eps=OPT["adam_eps"], betas=(0.9, 0.999), weight_decay=0.0)
    losses = []
    for tokens in TOKENS.split(2):
        logits = hf(input_ids=tokens).logits[:, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
        loss = _nll(lp, tokens)
        (loss / 2).backward()
        losses.append(float(loss.detach()))
    norm = float(torch.nn.utils.clip_grad_norm_(hf.parameters(), OPT["clip_grad"]))
    opt.step()
    return {"loss": sum(losses) / 2, "grad_norm": norm, "state": hf.state_dict()}


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    from slime.data.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("megatron-train")
    path = str(build_tiny_model(root / "m"))
    out = {}
    for layout in STEP_LAYOUTS.values():
        run_ranks(_train_worker, *layout, free_port(), path, str(root))
        out[layout] = torch.load(root / "train_{}_{}_{}.pt".format(*layout), weights_only=False)
    return out, _reference_step(path)


# name: (ranks, tensor-parallel, --use-distributed-optimizer)
STEP_LAYOUTS = {"tp1": (1, 1, False), "tp2": (2, 2, False), "dp2": (2, 1, False), "dp2_distopt": (2, 1, True)}


@pytest.mark.parametrize("name", list(STEP_LAYOUTS))
def test_a_megatron_step_is_the_plain_torch_step(steps, name):
    """TP=2 and DP=2 (Adam's state whole or sharded over the DP ranks) make the update TP=1 makes,
    and all of them the one written out with torch."""
    layout = STEP_LAYOUTS[name]
    runs, ref = steps
    got = runs[layout]
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    if layout[0] == layout[1]:  # with DP=2 rank 0 saw only its half of the batch
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert got["optimizer"] == ({"DistributedOptimizer"} if layout[2] else {"FP32Optimizer"}), got["optimizer"]
    assert got["split_marked"]  # else the gradient norm counts split weights on one rank only
    start = ref["state"]
    assert got["state"].keys() == start.keys()
    for k, v in start.items():
        torch.testing.assert_close(got["state"][k], v, rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def test_megatrons_training_machinery_needs_the_cpu_mode(steps):
    assert "CUDA" in steps[0][STEP_LAYOUTS["tp1"]]["bare_ddp"]
