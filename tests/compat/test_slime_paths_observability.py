"""slime's observability modules and slime.utils paths (ppo_utils, data, arguments,
external_utils, processing_utils.build_processor_kwargs) import by slime's names, with slime's
parameters, and do their work: each result checked against a reference computed here (a plain
loop, a hand count, the file read back)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import random
import statistics
import sys
import time
import zlib
from types import SimpleNamespace

import pytest
import torch

from slime.errors import SlimeError
from slime.utils.types import Sample
from tests.helpers import REQUIRED
from tests.helpers import make_args as full_args

# slime's parameters (name, default; "-" for none) at THUDM/slime commit 624b824
NONE = "-"
SLIME_SIGNATURES = {
    "slime.observability.timer:inverse_timer": [("name", NONE)],
    "slime.observability.timer:with_defer": [("deferred_func", NONE)],
    "slime.observability.metric_utils:compute_pass_rate": [
        ("flat_rewards", NONE),
        ("group_size", NONE),
        ("num_groups", None),
    ],
    "slime.observability.metric_utils:compression_ratio": [
        ("data", NONE),
        ("encoding", "utf-8"),
        ("algorithm", "zlib"),
        ("level", 9),
    ],
    "slime.observability.metric_utils:compute_rollout_step": [("args", NONE), ("rollout_id", NONE)],
    "slime.observability.logging_utils:configure_logger": [("prefix", "")],
    "slime.observability.logging_utils:init_tracking": [("args", NONE), ("primary", True), ("kwargs", NONE)],
    "slime.observability.logging_utils:log": [("args", NONE), ("metrics", NONE), ("step_key", NONE)],
    "slime.observability.wandb_utils:init_wandb_secondary": [("args", NONE), ("role", None)],
    "slime.observability.trace_utils:trace_span": [
        ("target", NONE),
        ("name", NONE),
        ("attrs", None),
        ("record_error", True),
    ],
    "slime.observability.trace_utils:trace_function": [
        ("name", NONE),
        ("target", None),
        ("target_getter", None),
        ("attrs_getter", None),
        ("record_error", True),
    ],
    "slime.observability.trace_utils:bind_trace_carrier": [
        ("carrier", NONE),
        ("trace_id", None),
        ("sample_id", None),
        ("group_id", None),
        ("attempt", 0),
        ("parent_span_id", None),
    ],
    "slime.observability.rollout_metrics:log_rollout_data": [
        ("rollout_id", NONE),
        ("args", NONE),
        ("samples", NONE),
        ("rollout_extra_metrics", NONE),
        ("rollout_time", NONE),
    ],
    "slime.observability.rollout_metrics:log_eval_rollout_data": [
        ("rollout_id", NONE),
        ("args", NONE),
        ("data", NONE),
        ("extra_metrics", None),
    ],
    "slime.observability.rollout_data_utils:load_debug_rollout_data": [
        ("path_template", NONE),
        ("rollout_id", NONE),
        ("subsample_ratio", None),
    ],
    "slime.observability.rollout_data_utils:save_debug_rollout_data": [
        ("path_template", NONE),
        ("data", NONE),
        ("rollout_id", NONE),
        ("evaluation", NONE),
    ],
    "slime.observability.train_data_utils:restore_context_parallel_fields_to_cpu": [
        ("rollout_data", NONE),
        ("gather_tensor", NONE),
        ("keep_restored", NONE),
    ],
    "slime.observability.train_metric_utils:reduce_train_step_metrics": [
        ("losses_reduced", NONE),
        ("calculate_per_token_loss", NONE),
        ("step_global_batch_size", NONE),
        ("cp_size", NONE),
        ("dp_with_cp_group", NONE),
    ],
    "slime.observability.train_metric_utils:gather_log_data": [
        ("metric_name", NONE),
        ("args", NONE),
        ("rollout_id", NONE),
        ("log_dict", NONE),
    ],
    "slime.utils.ppo_utils:compute_approx_kl": [
        ("log_probs", NONE),
        ("log_probs_base", NONE),
        ("kl_loss_type", NONE),
        ("importance_ratio", None),
    ],
    "slime.utils.ppo_utils:compute_policy_loss": [
        ("ppo_kl", NONE),
        ("advantages", NONE),
        ("eps_clip", NONE),
        ("eps_clip_high", NONE),
        ("eps_clip_c", None),
    ],
    "slime.utils.ppo_utils:get_reinforce_plus_plus_returns": [
        ("rewards", NONE),
        ("kl", NONE),
        ("loss_masks", NONE),
        ("response_lengths", NONE),
        ("total_lengths", NONE),
        ("kl_coef", NONE),
        ("gamma", NONE),
    ],
    "slime.utils.ppo_utils:get_advantages_and_returns_batch": [
        ("total_lengths", NONE),
        ("response_lengths", NONE),
        ("values_list", NONE),
        ("rewards_list", NONE),
        ("gamma", NONE),
        ("lambd", NONE),
        ("chunked", True),
    ],
    "slime.utils.ppo_utils:chunked_discounted_returns": [("rewards", NONE), ("discount", NONE), ("chunk_size", 128)],
    "slime.utils.ppo_utils:calculate_log_probs_and_entropy": [
        ("logits", NONE),
        ("tokens", NONE),
        ("tp_group", NONE),
        ("with_entropy", False),
        ("chunk_size", -1),
        ("log_prob_keep_mask", None),
        ("with_entropy_grad", True),
    ],
    "slime.utils.data:Dataset": [
        ("path", NONE),
        ("tokenizer", NONE),
        ("processor", NONE),
        ("max_length", NONE),
        ("prompt_key", "text"),
        ("multimodal_keys", None),
        ("label_key", None),
        ("tool_key", None),
        ("metadata_key", "metadata"),
        ("seed", 42),
        ("apply_chat_template", False),
        ("apply_chat_template_kwargs", None),
    ],
    "slime.utils.data:process_rollout_data": [
        ("args", NONE),
        ("rollout_data_ref", NONE),
        ("dp_rank", NONE),
        ("dp_size", NONE),
    ],
    "slime.utils.arguments:parse_args": [("add_custom_arguments", None)],
    "slime.utils.arguments:get_slime_extra_args_provider": [("add_custom_arguments", None)],
    "slime.utils.external_utils.command_utils:execute_train": [
        ("train_args", NONE),
        ("num_gpus_per_node", NONE),
        ("megatron_model_type", NONE),
        ("train_script", "train.py"),
        ("before_ray_job_submit", None),
        ("extra_env_vars", None),
        ("config", None),
    ],
    "slime.utils.external_utils.typer_utils:dataclass_cli": [("func", NONE), ("env_var_prefix", "SLIME_SCRIPT_")],
    "slime.utils.processing_utils:build_processor_kwargs": [("multimodal_inputs", None)],
}


@pytest.mark.parametrize("path", sorted(SLIME_SIGNATURES))
def test_slime_names_import_with_slimes_parameters(path):
    module, name = path.split(":")
    obj = getattr(importlib.import_module(module), name)
    params = [
        (p.name, NONE if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(obj).parameters.values()
    ]
    assert params == SLIME_SIGNATURES[path]


# ============================================================== timer


def test_inverse_timer_leaves_the_paused_block_out_and_with_defer_runs_after_a_raise():
    from slime.observability.timer import inverse_timer, timer, with_defer

    store: dict[str, float] = {}
    with timer("train_wait", store):
        time.sleep(0.05)
        with inverse_timer("train_wait"):
            time.sleep(0.3)
    assert 0.05 <= store["perf/train_wait_time"] < 0.25
    with pytest.raises(SlimeError, match="no timer"):
        with inverse_timer("not_running"):
            pass

    calls = []

    @with_defer(lambda: calls.append("deferred"))
    def boom():
        calls.append("body")
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        boom()
    assert calls == ["body", "deferred"]


# ============================================================== metric_utils


def test_metric_utils_against_hand_computations():
    from slime.observability import metric_utils as M

    rewards = [1, 0, 0, 0, 1, 1, 0, 1]  # two groups of 4: 1 and 3 correct
    got = M.compute_pass_rate(rewards, group_size=4)

    def pass_at(n, c, k):
        return 1 - math.comb(n - c, k) / math.comb(n, k)

    for k in (1, 2, 4):
        assert got[f"pass@{k}"] == pytest.approx((pass_at(4, 1, k) + pass_at(4, 3, k)) / 2)
    assert set(got) == {"pass@1", "pass@2", "pass@4"}
    assert M.compute_pass_rate([1, 0], group_size=1) == {}

    vals = [3.0, 1.0, 4.0, 1.5]
    assert M.compute_statistics(vals) == {
        "mean": statistics.mean(vals),
        "median": statistics.median(vals),
        "max": 4.0,
        "min": 1.0,
    }
    text = "abc" * 1000
    ratio, saved = M.compression_ratio(text)
    assert ratio == pytest.approx(3000 / len(zlib.compress(text.encode(), 9)))
    assert saved == pytest.approx(100 * (1 - len(zlib.compress(text.encode(), 9)) / 3000))
    assert M.has_repetition("ab" * 6000) and not M.has_repetition("ab" * 100)
    assert M.dict_add_prefix({"a": 1}, "x/") == {"x/a": 1}
    args = SimpleNamespace(
        wandb_always_use_train_step=True, rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=4
    )
    assert M.compute_rollout_step(args, 3) == 3 * 4 * 2 // 4


# ============================================================== trace_utils


def test_trace_spans_and_events_form_a_timeline_written_to_the_run_dir(tmp_path):
    from slime.observability.trace_utils import save_rollout_trace, trace_event, trace_function, trace_span

    samples = [Sample(index=i, group_index=i // 2) for i in range(3)]

    @trace_function("generate_and_rm", target="sample")
    def generate(sample):
        with trace_span(sample, "sglang_generate", attrs={"max_new_tokens": 8}) as span:
            time.sleep(0.02)
            span.set("completion_tokens", 5)
        trace_event(sample, "reward_done", attrs={"reward": 1.0})

    for s in samples:
        generate(s)
    with pytest.raises(ValueError):
        with trace_span(samples[0], "reward_model"):
            raise ValueError("rm down")

    events = samples[0].trace["events"]
    kinds = [(e["type"], e["name"]) for e in events]
    assert kinds[:4] == [
        ("span_start", "generate_and_rm"),
        ("span_start", "sglang_generate"),
        ("span_end", "sglang_generate"),
        ("event", "reward_done"),
    ]
    outer, inner = events[0], events[1]
    assert inner["parent_span_id"] == outer["span_id"]
    assert events[2]["attrs"] == {"completion_tokens": 5}
    assert events[-1]["attrs"]["error_type"] == "ValueError"

    path = save_rollout_trace(tmp_path, 7, samples)
    assert path == tmp_path / "traces" / "rollout_7.trace.json"
    trace = json.loads(path.read_text())["traceEvents"]
    bars = [e for e in trace if e["ph"] == "X" and e["name"] == "sglang_generate"]
    assert len(bars) == 3 and all(e["dur"] >= 20000 for e in bars)  # microseconds
    assert {(e["pid"], e["tid"]) for e in bars} == {(0, 0), (0, 1), (1, 2)}
    gen = next(e for e in trace if e["ph"] == "X" and e["name"] == "generate_and_rm" and e["tid"] == 0)
    bar0 = next(e for e in bars if e["tid"] == 0)
    assert gen["ts"] <= bar0["ts"] and bar0["ts"] + bar0["dur"] <= gen["ts"] + gen["dur"]
    assert bar0["args"] == {"max_new_tokens": 8, "completion_tokens": 5, "attempt": 0}
    assert sum(e["ph"] == "i" for e in trace) == 3
    assert save_rollout_trace(tmp_path, 8, [Sample()]) is None  # nothing traced, nothing written


def test_a_trace_survives_the_debug_dump_and_converts(tmp_path):
    from slime.observability.rollout_data_utils import save_debug_rollout_data
    from slime.observability.trace_utils import chrome_trace_from_dump, trace_span

    s = Sample(index=0, group_index=0)
    with trace_span(s, "reward_model"):
        pass
    save_debug_rollout_data(str(tmp_path / "r_{rollout_id}.pt"), [s], rollout_id=0, evaluation=False)
    out = chrome_trace_from_dump(tmp_path / "r_0.pt")
    names = [e["name"] for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names == ["reward_model"]


# ============================================================== logging_utils, rollout_metrics


def _samples_for_metrics():
    out = []
    for i, (reward, n, truncated) in enumerate([(1.0, 4, False), (1.0, 6, True), (0.0, 2, False), (1.0, 8, False)]):
        s = Sample(index=i, group_index=i // 2, reward=reward, response="x" * n, response_length=n)
        s.status = Sample.Status.TRUNCATED if truncated else Sample.Status.COMPLETED
        s.prefix_cache_info.cached_tokens, s.prefix_cache_info.total_prompt_tokens = i, 10
        out.append(s)
    return out


def test_rollout_metrics_against_a_hand_count(tmp_path):
    from slime.observability.rollout_metrics import compute_metrics_from_samples, log_rollout_data

    args = full_args("--run-dir", str(tmp_path))
    m = compute_metrics_from_samples(args, _samples_for_metrics())
    assert m["response_len/mean"] == (4 + 6 + 2 + 8) / 4 and m["response_len/max"] == 8
    assert m["zero_std/count_1.0"] == 1  # group 0 all 1.0; group 1 mixed
    assert m["truncated_ratio"] == 0.25 and m["repetition_frac"] == 0.0
    assert m["prefix_cache_hit_rate"] == pytest.approx((0 + 1 + 2 + 3) / 40)

    log_rollout_data(3, args, _samples_for_metrics(), {"rollout/extra": 1.5}, rollout_time=2.0)
    record = json.loads((tmp_path / "hook_metrics.jsonl").read_text().splitlines()[-1])
    assert record["step_key"] == "rollout/step" and record["step"] == 3
    assert record["rollout/extra"] == 1.5 and record["perf/rollout_time"] == 2.0
    assert record["perf/tokens_per_gpu_per_sec"] == pytest.approx(20 / 2.0 / args.rollout_num_gpus)


def test_log_reaches_tensorboard(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from slime.observability import logging_utils
    from slime.observability.tensorboard_utils import _TensorboardAdapter

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    args = full_args("--run-dir", str(tmp_path), "--use-tensorboard")
    _TensorboardAdapter.clear_instances()
    try:
        logging_utils.log(args, {"eval/acc": 0.75, "eval/step": 4}, step_key="eval/step")
        _TensorboardAdapter(args).finish()
    finally:
        _TensorboardAdapter.clear_instances()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    [event] = acc.Scalars("eval/acc")
    assert (event.step, event.value) == (4, 0.75)


def test_init_tracking_log_and_finish_write_an_offline_wandb_run(tmp_path, monkeypatch):
    from slime.observability import logging_utils
    from slime.observability.wandb_sink import read_offline_history

    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = full_args("--run-dir", str(tmp_path), "--use-wandb", "--wandb-mode", "offline")
    logging_utils.init_tracking(args)
    assert args.wandb_run_id
    logging_utils.log(args, {"rollout/custom": 2.5, "rollout/step": 1}, step_key="rollout/step")
    logging_utils.finish_tracking(args)
    rows = read_offline_history(tmp_path, args.wandb_run_id, wait_s=30)
    assert any(row.get("rollout/custom") == 2.5 and row.get("rollout/step") == 1 for _, row in rows)


# ============================================================== ppo_utils


def _ref_discounted(x, discount):
    out, running = [0.0] * len(x), 0.0
    for t in reversed(range(len(x))):
        running = float(x[t]) + discount * running
        out[t] = running
    return torch.tensor(out)


def test_ppo_utils_kl_and_losses_against_their_formulas():
    from slime.utils import ppo_utils as P

    torch.manual_seed(0)
    lp, base = torch.randn(6), torch.randn(6)
    r = base - lp
    assert torch.allclose(P.compute_approx_kl(lp, base, "k3"), r.exp() - 1 - r, atol=1e-6)
    assert torch.allclose(P.compute_approx_kl(lp, base, "k2"), (lp - base) ** 2 / 2, atol=1e-6)

    kl, adv = torch.randn(6) * 0.5, torch.randn(6)
    loss, clipfrac = P.compute_policy_loss(kl, adv, 0.2, 0.28)
    ratio = torch.exp(-kl)
    want = torch.stack([-ratio * adv, -ratio.clamp(0.8, 1.28) * adv]).max(dim=0).values
    assert torch.allclose(loss, want) and torch.equal(
        clipfrac, ((ratio < 0.8) | (ratio > 1.28)).float() * ((-ratio.clamp(0.8, 1.28) * adv) > (-ratio * adv)).float()
    )
    dual, _ = P.compute_policy_loss(kl, adv, 0.2, 0.28, eps_clip_c=3.0)
    assert torch.allclose(dual, torch.where(adv < 0, torch.minimum(want, -3.0 * adv), want))
    cispo, _ = P.compute_cispo_loss(kl, lp, adv, 0.2, 0.28)
    assert torch.allclose(cispo, -ratio.clamp(0.8, 1.28) * adv * lp)


def test_ppo_utils_returns_and_gae_against_plain_loops():
    from slime.utils import ppo_utils as P

    torch.manual_seed(1)
    kl = [torch.rand(4), torch.rand(3)]
    masks = [torch.tensor([1, 1, 0, 1]), torch.tensor([1, 1, 0])]
    rewards = torch.tensor([1.0, -0.5])
    grpo = P.get_grpo_returns(rewards, kl)
    assert torch.equal(grpo[1], torch.full((3,), -0.5))

    got = P.get_reinforce_plus_plus_returns(rewards, kl, masks, [4, 3], [9, 7], kl_coef=0.1, gamma=0.9)
    for i, (k, m) in enumerate(zip(kl, masks, strict=True)):
        token_rewards = (-0.1 * k * m).tolist()
        token_rewards[max(j for j in range(len(m)) if m[j])] += float(rewards[i])
        assert torch.allclose(got[i], _ref_discounted(token_rewards, 0.9), atol=1e-6)
    base = P.get_reinforce_plus_plus_baseline_advantages(rewards, kl, masks, kl_coef=0.1)
    assert torch.allclose(base[0], 1.0 - 0.1 * kl[0])

    rew, val = torch.randn(2, 300), torch.randn(2, 300)
    assert torch.allclose(P.chunked_discounted_returns(rew, 0.95)[1], _ref_discounted(rew[1], 0.95), atol=1e-4)
    adv, ret = P.vanilla_gae(rew, val, 0.99, 0.95)
    deltas = rew[0] + 0.99 * torch.cat([val[0, 1:], torch.zeros(1)]) - val[0]
    assert torch.allclose(adv[0], _ref_discounted(deltas, 0.99 * 0.95), atol=1e-4)
    assert torch.allclose(ret, adv + val)
    cadv, _ = P.chunked_gae(rew, val, 0.99, 0.95)
    assert torch.allclose(cadv, adv, atol=1e-4)
    advs, rets = P.get_advantages_and_returns_batch(
        [0, 0], [5, 3], [val[0, :5], val[1, :3]], [rew[0, :5], rew[1, :3]], 0.99, 0.95
    )
    short = _ref_discounted(rew[1, :3] + 0.99 * torch.cat([val[1, 1:3], torch.zeros(1)]) - val[1, :3], 0.99 * 0.95)
    assert [a.shape[0] for a in advs] == [5, 3] and torch.allclose(advs[1], short, atol=1e-5)


def test_ppo_utils_sequence_masks_and_log_probs():
    from slime.utils import ppo_utils as P

    lp = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    old = [torch.tensor([-0.2, -0.2]), torch.tensor([-1.0, -1.1, -1.0])]
    adv = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    masks = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0, 1.0])]
    mask, clipfrac = P.compute_opsm_mask(SimpleNamespace(opsm_delta=0.5), lp, old, adv, masks)
    assert mask.tolist() == [0, 0, 1, 1, 1] and clipfrac.item() == 1.0  # sample 0: seq kl 0.8 > 0.5
    gspo = P.compute_gspo_kl(lp, old, lp, masks)
    assert torch.allclose(gspo, torch.tensor([0.8, 0.8, -0.1 / 3, -0.1 / 3, -0.1 / 3]))

    torch.manual_seed(2)
    logits, tokens = torch.randn(5, 7), torch.randint(0, 7, (5,))
    log_prob, entropy = P.calculate_log_probs_and_entropy(logits, tokens, None, with_entropy=True, chunk_size=2)
    ref = torch.log_softmax(logits, -1)
    assert log_prob.shape == (5, 1) and torch.allclose(log_prob[:, 0], ref[torch.arange(5), tokens], atol=1e-6)
    assert torch.allclose(entropy, -(ref.exp() * ref).sum(-1), atol=1e-5)
    keep = torch.zeros(5, 7, dtype=torch.bool)
    keep[:, :3] = True
    kept, none = P.calculate_log_probs_and_entropy(logits, tokens, None, log_prob_keep_mask=keep)
    allowed = keep.clone()
    allowed[torch.arange(5), tokens] = True
    masked_ref = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1)[torch.arange(5), tokens]
    assert none is None and torch.allclose(kept[:, 0], masked_ref, atol=1e-6)


# ============================================================== slime.utils.data, arguments, external, processing


def test_dataset_reads_slices_filters_and_shuffles_as_slime(tmp_path):
    from slime.utils.data import Dataset, get_source, read_file

    path = tmp_path / "p.jsonl"
    rows = [{"text": "w " * (i + 1), "label": str(i), "metadata": {"source_name": f"s{i}"}} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["label"] for r in read_file(f"{path}@[1:3]")] == ["1", "2"]
    assert [r["label"] for r in read_file(f"{path}@[-2:]")] == ["4", "5"]

    def tokenizer(prompts, add_special_tokens=False):
        return {"input_ids": [p.split() for p in prompts]}

    ds = Dataset(str(path), tokenizer, None, 4, label_key="label", seed=3)
    assert [s.label for s in ds] == ["0", "1", "2", "3"]  # prompts of 5 and 6 words dropped
    ds_sliced = Dataset(f"{path}@[2:]", tokenizer, None, None, label_key="label")
    assert [s.label for s in ds_sliced] == ["2", "3", "4", "5"]
    ds.shuffle(1)
    order = list(range(4))
    random.seed(3 + 1)  # slime's rule: the module-level generator seeded with seed + epoch
    random.shuffle(order)
    assert [s.label for s in ds] == [str(i) for i in order]
    assert get_source(ds[0]) == f"s{order[0]}" and get_source(Sample()) == "unknown"
    with pytest.raises(SlimeError, match="multimodal"):
        Dataset(str(path), tokenizer, None, None, multimodal_keys={"image": "images"})


def test_parse_args_with_custom_arguments_sees_the_custom_option(monkeypatch):
    from slime.utils import arguments as A

    def add_custom(parser):
        parser.add_argument("--my-reward-scale", type=float, default=1.0)
        return parser

    monkeypatch.setattr(sys, "argv", ["train.py", *REQUIRED, "--my-reward-scale", "2.5", "--rollout-batch-size", "4"])
    args = A.parse_args(add_custom)
    assert args.my_reward_scale == 2.5 and args.rollout_batch_size == 4
    monkeypatch.setattr(sys, "argv", ["train.py", *REQUIRED])
    assert A.parse_args(add_custom).my_reward_scale == 1.0
    assert not hasattr(A.parse_args(), "my_reward_scale")

    def clash(parser):
        parser.add_argument("--rollout-batch-size", type=int)

    with pytest.raises(SlimeError, match="--rollout-batch-size"):
        A.parse_args(clash)

    import argparse

    parser = A.get_slime_extra_args_provider(add_custom)(argparse.ArgumentParser())
    ns = parser.parse_args(["--my-reward-scale", "3", "--n-samples-per-prompt", "8"])
    assert ns.my_reward_scale == 3.0 and ns.n_samples_per_prompt == 8
    A.reset_arg(parser, "--n-samples-per-prompt", default=16)
    A.reset_arg(parser, "--brand-new", type=int, default=5)
    assert parser.parse_args([]).n_samples_per_prompt == 16 and parser.parse_args([]).brand_new == 5


def test_command_utils_run_the_training_command_with_the_env(tmp_path, monkeypatch):
    from slime.utils.external_utils import command_utils as U

    script = tmp_path / "my_train.py"
    out = tmp_path / "out.json"
    script.write_text(
        "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': os.environ.get('MY_FLAG')}}, open({str(out)!r}, 'w'))\n"
    )
    U.execute_train("--a 1 --b 'two words'", 0, None, train_script=str(script), extra_env_vars={"MY_FLAG": "on"})
    assert json.loads(out.read_text()) == {"argv": ["--a", "1", "--b", "two words"], "env": "on"}
    assert U.exec_command("echo hi", capture_output=True) == "hi\n"
    assert U._parse_extra_env_vars("A=1 B=x") == {"A": "1", "B": "x"}
    assert U._parse_extra_env_vars('{"A": "1"}') == {"A": "1"}
    monkeypatch.setenv("SLIME_X", "TRUE")
    assert U.get_bool_env_var("SLIME_X") and not U.get_bool_env_var("SLIME_UNSET")
    with pytest.raises(SlimeError, match="Hugging Face"):
        U.convert_checkpoint("m", "qwen3-4B", 8)


@dataclasses.dataclass
class Demo:
    name: str
    count: int = 1


def _demo_main(args: Demo):
    print(f"{args.name}|{args.count}")


def test_dataclass_cli_builds_env_backed_options(monkeypatch, capsys):
    from typing import get_args

    from slime.utils.external_utils.typer_utils import dataclass_cli

    # a stand-in for the script's typer (not a dependency of this repo): records the Option it builds
    monkeypatch.setitem(sys.modules, "typer", SimpleNamespace(Option=lambda **kw: ("Option", kw)))
    wrapped = dataclass_cli(_demo_main)
    params = inspect.signature(wrapped).parameters
    assert list(params) == ["name", "count"] and params["count"].default == 1
    assert get_args(params["name"].annotation) == (str, ("Option", {"envvar": "SLIME_SCRIPT_NAME"}))
    assert get_args(params["count"].annotation) == (int, ("Option", {"envvar": "SLIME_SCRIPT_COUNT"}))
    wrapped(name="x", count=9)
    assert "x|9" in capsys.readouterr().out
    monkeypatch.delitem(sys.modules, "typer")
    with pytest.raises(SlimeError, match="import typer"):
        dataclass_cli(_demo_main)


def test_build_processor_kwargs_is_slimes():
    from slime.utils.processing_utils import build_processor_kwargs

    got = build_processor_kwargs({"images": ["img"], "images_kwargs": {"max_pixels": 10, "return_tensors": "np"}})
    assert got == {
        "images": ["img"],
        "images_kwargs": {"max_pixels": 10, "return_tensors": "pt"},
        "text_kwargs": {"return_tensors": None, "return_mm_token_type_ids": False},
        "audio_kwargs": {"return_tensors": "pt"},
        "videos_kwargs": {"return_tensors": "pt"},
    }
