"""slime options built on the torch backend: --save-hf, --use-stateless-adam, the Megatron plugin
hooks before a train step / a log-prob pass, --log-probs-max-tokens-per-gpu and
--memory-recorder memray. Checked on a real tiny-model trainer (in-process, no Ray) against
references computed here: elementwise formulas, a fresh AdamW step, per-sample forwards, files
read back by transformers and memray."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime.arguments import parse_args, startup_notes
from slime.backends.torch import step
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.memory_recorder import MemoryRecorder
from slime.backends.torch.optim import StatelessAdam
from slime.errors import SlimeError
from tests.contracts import hooks

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]
DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11, 3], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 3, 2, 3],
    "loss_masks": [[1, 1], [1, 0, 1], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}
H = "tests.contracts.hooks."


def _args(tiny_model_dir, tmp_path, *extra, num_rollout=4):
    return parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            str(num_rollout),
            "--lr",
            "1e-2",
            "--run-dir",
            str(tmp_path),
            *extra,
        ]
    )


def _actor(tiny_model_dir, tmp_path, *extra):
    actor = TrainActor(
        _args(tiny_model_dir, tmp_path, *extra),
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=0,
        num_threads=1,
    )
    actor.init()
    return actor


def _copy(data):
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in data.items()}


# ------------------------------------------------------------------ --save-hf


def test_save_hf_writes_a_model_directory_transformers_loads_with_the_trained_weights(tiny_model_dir, tmp_path):
    pattern = str(tmp_path / "hf" / "iter_{rollout_id}")
    actor = _actor(tiny_model_dir, tmp_path, "--save-hf", pattern, "--save", str(tmp_path / "ckpt"))
    actor.train(0, _copy(DATA))
    actor.save(0)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "iter_0")
    AutoTokenizer.from_pretrained(tmp_path / "hf" / "iter_0")  # the tokenizer is there too
    trained, initial = actor.model.state_dict(), AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    got = loaded.state_dict()
    assert set(got) == set(trained)
    for name, value in trained.items():
        assert torch.equal(got[name], value), name
    assert any(not torch.equal(initial[n], trained[n]) for n in trained)  # it is the trained policy
    actor.train(1, _copy(DATA))
    actor.save(1)
    assert torch.equal(
        AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "iter_1").state_dict()["lm_head.weight"],
        actor.model.state_dict()["lm_head.weight"],
    )


def test_save_hf_refuses_the_hf_checkpoint_and_a_bad_pattern(tiny_model_dir, tmp_path):
    with pytest.raises(SlimeError, match=r"--save-hf .*rollout_id"):
        _args(tiny_model_dir, tmp_path, "--save-hf", str(tmp_path / "x_{step}"))
    actor = _actor(tiny_model_dir, tmp_path, "--save-hf", str(tiny_model_dir), "--save", str(tmp_path / "ckpt"))
    with pytest.raises(SlimeError, match="is --hf-checkpoint"):
        actor.save(0)


# ------------------------------------------------------------------ --use-stateless-adam


def test_stateless_adam_is_a_first_adam_step_every_step():
    torch.manual_seed(0)
    lr, eps, wd = 0.01, 1e-3, 0.1
    param = torch.nn.Parameter(torch.randn(7, dtype=torch.float64))
    opt = StatelessAdam([param], lr=lr, betas=(0.8, 0.95), eps=eps, weight_decay=wd)
    for _ in range(3):
        before = param.detach().clone()
        param.grad = torch.randn(7, dtype=torch.float64)
        # by hand, element by element: decoupled decay, then lr * g / (|g| + eps)
        want = [
            p * (1 - lr * wd) - lr * g / (abs(g) + eps)
            for p, g in zip(before.tolist(), param.grad.tolist(), strict=True)
        ]
        # and as AdamW's first step from zero moments (bias-corrected), whatever came before
        ref = torch.nn.Parameter(before.clone())
        ref.grad = param.grad.clone()
        adamw = torch.optim.AdamW([ref], lr=lr, betas=(0.8, 0.95), eps=eps, weight_decay=wd)
        adamw.step()
        opt.step()
        assert param.detach().tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
        assert torch.allclose(param.detach(), ref.detach(), rtol=1e-12, atol=1e-15)
    assert len(opt.state) == 0  # no moments kept


@pytest.mark.filterwarnings("ignore:Seems like:UserWarning")  # optimizer.step is wrapped on purpose
def test_stateless_adam_trains_the_policy_and_needs_no_save_optim(tiny_model_dir, tmp_path):
    with pytest.raises(SlimeError, match="--use-stateless-adam .*--no-save-optim"):
        _args(tiny_model_dir, tmp_path, "--use-stateless-adam")
    actor = _actor(tiny_model_dir, tmp_path, "--use-stateless-adam", "--no-save-optim", "--weight-decay", "0.1")
    assert isinstance(actor.optimizer, StatelessAdam)
    seen = []
    original = actor.optimizer.step

    def spy():
        seen.append(
            [
                (p.detach().clone(), p.grad.clone(), actor.optimizer.param_groups[0]["lr"])
                for p in actor.model.parameters()
            ]
        )
        original()

    actor.optimizer.step = spy
    actor.train(0, _copy(DATA))
    assert len(seen) == 1 and len(actor.optimizer.state) == 0
    eps, wd = actor.args.adam_eps, 0.1
    for (p0, g, lr), p1 in zip(seen[0], actor.model.parameters(), strict=True):
        assert torch.allclose(p1.detach(), p0 * (1 - lr * wd) - lr * g / (g.abs() + eps), atol=1e-7)


# ------------------------------------------------------------------ Megatron plugin hooks


def test_before_train_step_and_before_log_prob_hooks_get_slimes_call(tiny_model_dir, tmp_path):
    hooks.CALLS.pop("train_step", None)
    hooks.CALLS.pop("log_prob", None)
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--custom-megatron-before-train-step-hook-path",
        H + "before_train_step",
        "--custom-megatron-before-log-prob-hook-path",
        H + "before_log_prob",
        "--use-kl-loss",
        "--num-steps-per-rollout",
        "2",
    )
    actor.train(3, _copy(DATA))
    calls = hooks.CALLS["train_step"]
    assert [(c[0], c[1]) for c in calls] == [(3, 0), (3, 1)]
    for _, _, model, optimizer, scheduler, _lr, grads_clear in calls:
        assert model == [actor.model] and optimizer is actor.optimizer and scheduler is actor.scheduler
        assert grads_clear
    assert calls[0][5] == pytest.approx(1e-2)  # the learning rate the step is about to use
    prefixes = [(prefix, model[0]) for prefix, model, _ in hooks.CALLS["log_prob"]]
    assert prefixes == [("", actor.model), ("ref_", actor.ref_model)]
    assert all(training == [False] for _, _, training in hooks.CALLS["log_prob"])


# ------------------------------------------------------------------ --log-probs-max-tokens-per-gpu


def test_log_probs_budget_defaults_to_max_tokens_and_needs_dynamic_batching():
    args = parse_args(BASE + ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "9"])
    assert args.log_probs_max_tokens_per_gpu == 9
    with pytest.raises(SlimeError, match="--log-probs-max-tokens-per-gpu only applies"):
        parse_args(BASE + ["--log-probs-max-tokens-per-gpu", "9"])


def _reference_log_probs(model, data, i):
    """Sample i alone, unpadded: log-softmax of the logits that predict its response tokens."""
    toks, r = data["tokens"][i], data["response_lengths"][i]
    with torch.no_grad():
        logits = model(torch.tensor([toks])).logits[0].double()
    picked = logits[len(toks) - r - 1 : len(toks) - 1]
    return torch.log_softmax(picked, -1)[torch.arange(r), torch.tensor(toks[len(toks) - r :])]


def test_log_prob_micro_batches_follow_their_budget_and_match_unbatched(tiny_model_dir, tmp_path, monkeypatch):
    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "8",
        "--log-probs-max-tokens-per-gpu",
        "11",
    )
    built = []
    real = step.micro_batch

    def record(rank, columns, indices):
        built.append(list(indices))
        return real(rank, columns, indices)

    monkeypatch.setattr(step, "micro_batch", record)
    data = _copy(DATA)
    got = actor._forward_only(data, [0, 1, 2, 3], actor.model)
    lengths = [len(t) for t in DATA["tokens"]]  # 5, 6, 4, 6
    assert built == [[0, 1], [2, 3]]  # greedy under 11 tokens; under 8 each would be alone
    assert all(sum(lengths[i] for i in mb) <= 11 for mb in built)
    for i in range(4):
        want = _reference_log_probs(actor.model, DATA, i)
        assert torch.allclose(got[i].double(), want, atol=1e-5), i
    built.clear()
    actor.reuse_training_forward = False  # a separate old log-prob pass, then the optimizer step
    actor.train(0, data)
    assert built == [[0, 1], [2, 3], [0], [1], [2], [3]]  # the step keeps --max-tokens-per-gpu


# ------------------------------------------------------------------ --memory-recorder memray


def test_memory_recorder_options_parse_as_slimes():
    args = parse_args(BASE + ["--record-memory-history"])
    assert (args.memory_recorder, args.memory_snapshot_dir, args.memory_snapshot_num_steps) == ("torch", ".", None)
    assert any("--memory-recorder torch (CUDA memory snapshots are GPU-only)" in n for n in startup_notes(args))
    with pytest.raises(SlimeError, match="--memory-snapshot-num-steps"):
        parse_args(BASE + ["--record-memory-history", "--memory-recorder", "memray"])


@pytest.mark.skipif(importlib.util.find_spec("memray") is None, reason="memray is not installed (pip install memray)")
def test_memray_capture_of_the_trainer_is_written_and_readable(tiny_model_dir, tmp_path):
    import memray

    actor = _actor(
        tiny_model_dir,
        tmp_path,
        "--record-memory-history",
        "--memory-recorder",
        "memray",
        "--memory-snapshot-num-steps",
        "2",
        "--memory-snapshot-dir",
        str(tmp_path / "mem"),
    )
    assert actor.memory.recording
    actor.train(0, _copy(DATA))
    assert actor.memory.recording  # until rollout num_steps - 1 has trained
    actor.train(1, _copy(DATA))
    assert not actor.memory.recording
    (path,) = (tmp_path / "mem").iterdir()
    assert path.name.startswith("memory_snapshot_time") and path.name.endswith("_rank0_snapshot.pickle")
    reader = memray.FileReader(str(path))
    assert reader.metadata.total_allocations > 0 and reader.metadata.peak_memory > 0
    assert math.isfinite(reader.metadata.peak_memory)


def test_no_memory_recorder_without_record_memory_history(tiny_model_dir, tmp_path):
    recorder = MemoryRecorder(_args(tiny_model_dir, tmp_path, "--memory-recorder", "memray"), rank=0)
    assert not recorder.recording and recorder.path is None
