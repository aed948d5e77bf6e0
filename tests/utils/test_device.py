"""Device selection and the device-agnostic trainer and engine on the CPU.

The CPU path must be exactly what it was before the device was chosen: a train step through
`TrainActor(device="cpu")` is compared bit for bit with the same step written out by hand with
the plain micro-batch, log-prob, loss and optimizer functions (no device code at all). The
CUDA-only branches are run by `scripts/gpu_check.sh` on a GPU machine; here the checks that stop a
CUDA request without a GPU, and --bf16 on a device without bf16, are shown to fire first."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.algorithms.losses import sft_loss
from slime.arguments import parse_args
from slime.backends.torch import attention
from slime.backends.torch import device as dev
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.batching import make_micro_batch, response_log_probs
from slime.backends.torch.optim import build_optimizer
from slime.errors import SlimeError
from slime.utils import accelerator

NO_GPU = not torch.cuda.is_available()
DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


def _args(tiny_model_dir, tmp_path, *extra):
    return parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "1",
            "--lr",
            "1e-2",
            "--micro-batch-size",
            "4",
            "--run-dir",
            str(tmp_path),
            *extra,
        ]
    )


# ------------------------------------------------------------------------------ selection
@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU")
def test_no_gpu_means_cpu_and_gloo():
    d = dev.select_device(rank=3)
    assert d == torch.device("cpu") and dev.process_group_backend(d) == "gloo"
    assert dev.select_device(0, "cpu") == torch.device("cpu")


def test_backend_follows_the_device():
    assert dev.process_group_backend(torch.device("cpu")) == "gloo"
    # NCCL for CUDA tensors, gloo still for the rank's CPU metric all-reduces
    assert dev.process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_a_cuda_request_without_a_gpu_stops_naming_the_option(name):
    with pytest.raises(SlimeError, match=rf"device {name}: this machine has no CUDA GPU"):
        dev.select_device(0, name)


@pytest.mark.parametrize("name, why", [("xpu", "only cpu and cuda"), ("not a device", "not a device name")])
def test_a_device_of_another_kind_stops(name, why):
    with pytest.raises(SlimeError, match=why):
        dev.select_device(0, name, option="--device")


def test_cpu_helpers_leave_tensors_alone():
    mb = make_micro_batch(DATA, [0, 1], pad_id=0)
    assert dev.to_device(mb, torch.device("cpu")) is mb
    t = torch.randn(3, requires_grad=True)
    assert dev.to_host(t) is t and dev.to_host(None) is None
    assert dev.memory_metrics(torch.device("cpu")) == {}
    assert isinstance(dev.autocast(torch.device("cpu"), False, False), contextlib.nullcontext)


def test_to_device_moves_every_tensor_field_and_keeps_the_rest():
    """The copy that a GPU gets: tensor fields moved (here to the CPU 'meta' stand-in), lists kept."""
    mb = make_micro_batch(DATA, [0, 3], pad_id=0)
    moved = dev.to_device(mb, torch.device("meta"))
    assert moved is not mb
    for name in ("input_ids", "attention_mask", "rows", "cols"):
        assert getattr(moved, name).device.type == "meta" and getattr(mb, name).device.type == "cpu"
    assert moved.response_lengths == mb.response_lengths and moved.loss_masks is mb.loss_masks


# ------------------------------------------------------------------------------ --bf16
def test_bf16_on_a_cpu_without_bf16_stops_at_parse_time(tiny_model_dir, tmp_path, monkeypatch):
    if not NO_GPU:
        pytest.skip("the trainer's device here is a GPU")
    monkeypatch.setattr(accelerator, "cpu_can_compute_bf16", lambda: False)
    with pytest.raises(SlimeError, match=r"--bf16: cpu \(.*\) cannot compute in bfloat16"):
        _args(tiny_model_dir, tmp_path, "--bf16")
    monkeypatch.undo()
    assert _args(tiny_model_dir, tmp_path, "--bf16").bf16 is True  # this CPU computes bf16


def test_cpu_bf16_probe_is_real():
    """The probe computes a bf16 product; torch's CPU build does (natively or via fp32)."""
    assert accelerator.cpu_can_compute_bf16() is True
    assert accelerator.bf16_supported(torch.device("cpu")) is True
    assert "cpu (" in accelerator.describe(torch.device("cpu"))


# ------------------------------------------------------------------------------ bit for bit
def _reference_sft_step(tiny_model_dir, args, data, bf16: bool):
    """One optimizer step written out with the plain functions: HF model, padded micro-batch,
    log-probs, sft loss, clip, AdamW (no device code)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # the trainer's attention (fp32 for short rows under bf16: tests/backends/test_attention.py)
    attention.install(model)
    model.train()
    model.config.use_cache = False
    opt, sched = build_optimizer(
        [p for p in model.parameters() if p.requires_grad], args, lr=args.lr, warmup=args.lr_warmup_iters
    )
    idx = list(range(len(data["tokens"])))
    denoms = [float(sum(m)) for m in data["loss_masks"]]
    num_tokens = float(sum(sum(m) for m in data["loss_masks"]))
    # --bf16 is autocast without its cache of weight casts (slime.backends.torch.device.autocast: the
    # cache broke FSDP2's gradients); with the cache this step's last bits differ, even on one rank
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False) if bf16 else contextlib.nullcontext()
    with ctx:
        opt.zero_grad(set_to_none=True)
        mb = make_micro_batch(data, idx, model.config.pad_token_id or 0, share_prompts=args.share_prompt_forward)
        lp, _ = response_log_probs(model, mb, args.rollout_temperature, with_entropy=True)
        loss = sft_loss(
            lp,
            mb.response_lengths,
            mb.loss_masks,
            sample_denoms=denoms,
            calculate_per_token_loss=False,
            num_samples=len(idx),
            num_tokens=num_tokens,
        )
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad))
        opt.step()
        sched.step()
    return float(loss.detach()), grad_norm, model


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_cpu_train_step_is_bit_for_bit_the_plain_one(tiny_model_dir, tmp_path, bf16):
    extra = ["--loss-type", "sft_loss"] + (["--bf16"] if bf16 else [])
    args = _args(tiny_model_dir, tmp_path, *extra)
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1, device="cpu")
    actor.init()
    assert actor.device == torch.device("cpu")
    metrics = actor.train(0, _copy(DATA))
    loss, grad_norm, ref = _reference_sft_step(tiny_model_dir, args, _copy(DATA), bf16)
    assert metrics["train/loss"] == loss and metrics["train/grad_norm"] == grad_norm
    assert not any(k.startswith("perf/train_") and "memory" in k for k in metrics)  # no GPU memory on the CPU
    mine = dict(actor.model.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.equal(mine[name], p), name
        assert mine[name].dtype == torch.float32  # fp32 master weights, bf16 only in autocast


def test_cpu_old_log_probs_are_the_plain_forward(tiny_model_dir, tmp_path):
    args = _args(tiny_model_dir, tmp_path)
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    got = actor._forward_only(_copy(DATA), [0, 1, 2, 3], actor.model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want, _ = response_log_probs(
            model,
            make_micro_batch(
                DATA, [0, 1, 2, 3], model.config.pad_token_id or 0, share_prompts=args.share_prompt_forward
            ),
        )
    assert all(g.device.type == "cpu" for g in got)
    assert torch.equal(torch.cat(got), want)


# ------------------------------------------------------------------------------ engine
@pytest.mark.e2e
@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU")
def test_engine_cuda_request_without_a_gpu_stops_at_start_up(tiny_model_dir):
    from slime.engine.args import resolve_device
    from slime.engine.model_runner import ModelRunner

    assert resolve_device(None) == torch.device("cpu") and resolve_device("auto") == torch.device("cpu")
    with pytest.raises(SlimeError, match="--device cuda: this machine has no CUDA GPU"):
        ModelRunner(str(tiny_model_dir), device="cuda")
    # the server says so and exits 2 before loading the model
    out = subprocess.run(
        [sys.executable, "-m", "slime.engine.server", "--model-path", str(tiny_model_dir), "--device", "cuda:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "--device cuda:0: this machine has no CUDA GPU" in out.stderr


def test_engine_on_cpu_is_unchanged(tiny_model_dir):
    """device=cpu: the same forward, the same logits as the default runner, memory is the RAM."""
    from slime.engine.model_runner import ModelRunner

    a = ModelRunner(str(tiny_model_dir), dtype="float32")
    b = ModelRunner(str(tiny_model_dir), dtype="float32", device="cpu")
    assert a.device == b.device == torch.device("cpu") and a.model_impl == b.model_impl == "native"
    mem = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    assert b.memory_bytes() == mem
    b.check_memory("--mem-fraction-static 0.9", 10 * mem)  # no GPU check on the CPU
    outs = []
    for r in (a, b):
        batch = r.new_batch()
        last, _, _ = r.add_rows(batch, [[5, 6, 7], [8, 9]], 4)
        nxt = r.decode(batch, last.argmax(-1))
        outs.append((last, nxt))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
