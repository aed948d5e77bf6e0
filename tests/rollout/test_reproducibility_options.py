"""--deterministic-mode, --seed / --rollout-seed and the torch profiler options: parsing, the
per-sample sampling seeds and request order of the rollout (against a recording fake engine), and
the profiler's traces (a real torch profiler on a small loop)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os

import pytest
import torch

from slime.arguments import parse_args
from slime.errors import SlimeError
from slime.observability.profile_utils import TrainProfiler
from slime.utils.types import Sample

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]


# ------------------------------------------------------------------ parsing


def test_defaults_are_slimes_and_megatrons():
    a = parse_args(BASE)
    assert (a.seed, a.rollout_seed, a.deterministic_mode) == (1234, 42, False)
    assert (a.use_pytorch_profiler, a.profile_step_start, a.profile_step_end) == (False, 10, 12)
    assert a.profile_target == ["train_overall"] and a.tensorboard_dir is None
    assert a.sglang_enable_deterministic_inference is False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--partial-rollout"], "--deterministic-mode cannot run with --partial-rollout"),
        (
            ["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async"],
            "--deterministic-mode cannot run with --rollout-function-path slime.rollout.fully_async_rollout",
        ),
    ],
)
def test_deterministic_mode_refuses_timing_dependent_features(argv, needle):
    with pytest.raises(SlimeError, match=needle):
        parse_args(BASE + ["--deterministic-mode", *argv])
    parse_args(BASE + argv)  # fine without it


def test_deterministic_mode_seeds_samples_and_asks_sglang_for_batch_invariance():
    a = parse_args(BASE + ["--deterministic-mode"])
    assert a.sglang_enable_deterministic_inference is True
    assert "--enable-deterministic-inference" not in a.sglang_args  # the built-in engine has no such flag
    sg = parse_args(BASE + ["--deterministic-mode", "--rollout-backend", "sglang"])
    assert sg.sglang_args.count("--enable-deterministic-inference") == 1
    sg = parse_args(
        BASE + ["--deterministic-mode", "--rollout-backend", "sglang", "--sglang-enable-deterministic-inference"]
    )
    assert sg.sglang_args.count("--enable-deterministic-inference") == 1
    # slime's own switch of per-sample seeds, without the rest of deterministic mode
    only = parse_args(BASE + ["--sglang-enable-deterministic-inference"])
    assert only.sglang_enable_deterministic_inference is True and only.deterministic_mode is False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--profile-step-start", "3", "--profile-step-end", "3"], r"--profile-step-end \(3\) must be greater"),
        (["--profile-step-start", "-1"], "--profile-step-start must be >= 0"),
        (["--profile-target", "train_overall", "train_actor"], "train_overall traces the whole step"),
    ],
)
def test_profiler_options_are_checked(argv, needle):
    with pytest.raises(SlimeError, match=needle):
        parse_args(BASE + ["--use-pytorch-profiler", *argv])


def test_profile_target_takes_slimes_choices_and_the_trace_dir_defaults_to_the_run():
    with pytest.raises(SlimeError, match="--profile-target"):
        parse_args(BASE + ["--profile-target", "rollout"])
    a = parse_args(
        BASE + ["--use-pytorch-profiler", "--profile-target", "train_actor", "train_log_probs", "--run-dir", "some/run"]
    )
    assert a.tensorboard_dir == os.path.abspath("some/run/tensorboard")
    assert parse_args(BASE + ["--use-pytorch-profiler", "--tensorboard-dir", "/x/tb"]).tensorboard_dir == "/x/tb"


# ------------------------------------------------------------------ rollout requests


class _RecordingEngine:
    """Stands in for `post` to the router: records each /generate payload and how many were in flight."""

    def __init__(self):
        self.payloads: list[dict] = []
        self.inflight = self.max_inflight = 0

    async def __call__(self, url, payload, headers=None, **kw):
        self.payloads.append(payload)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        await asyncio.sleep(0.01)
        self.inflight -= 1
        one = {
            "text": "7",
            "output_ids": [9],
            "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, 9]]},
        }
        return [one] * len(payload["input_ids"]) if isinstance(payload["input_ids"][0], list) else one


def _groups() -> list[list[Sample]]:
    groups = []
    for g in range(2):
        group = []
        for j in range(3):
            s = Sample(prompt="p", tokens=[1, 2, 3 + g], group_index=g, index=g * 3 + j)
            group.append(s)
        groups.append(group)
    return groups


def _generate(monkeypatch, tiny_model_dir, *argv):
    from slime.rollout import generation

    args = parse_args(
        BASE
        + [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--n-samples-per-prompt",
            "3",
            "--custom-rm-path",
            "tests.e2e.hooks.digit_reward",
            *argv,
        ]
    )
    engine = _RecordingEngine()
    monkeypatch.setattr(generation, "post", engine)
    generation.GenerateState.reset()
    try:

        async def both():
            params = generation.GenerateState(args).sampling_params
            return await asyncio.gather(*(generation.generate_and_rm_group(args, g, params) for g in _groups()))

        groups = asyncio.run(both())
    finally:
        generation.GenerateState.reset()
    assert all(s.response == "7" and s.reward == 1.0 for g in groups for s in g)
    return engine


def test_deterministic_mode_sends_seeded_samples_one_at_a_time_in_order(monkeypatch, tiny_model_dir):
    engine = _generate(monkeypatch, tiny_model_dir, "--deterministic-mode", "--rollout-seed", "100")
    assert engine.max_inflight == 1
    # slime's rule: sample i of every group gets --rollout-seed + i
    sent = [(p["input_ids"][-1], p["sampling_params"]["sampling_seed"]) for p in engine.payloads]
    assert sent == [(3, 100), (3, 101), (3, 102), (4, 100), (4, 101), (4, 102)]


def test_slimes_switch_seeds_samples_and_keeps_them_concurrent(monkeypatch, tiny_model_dir):
    engine = _generate(monkeypatch, tiny_model_dir, "--sglang-enable-deterministic-inference")
    assert engine.max_inflight > 1
    assert sorted(p["sampling_params"]["sampling_seed"] for p in engine.payloads) == [42, 42, 43, 43, 44, 44]


def test_without_it_a_group_is_one_unseeded_batch_request(monkeypatch, tiny_model_dir):
    engine = _generate(monkeypatch, tiny_model_dir)
    assert len(engine.payloads) == 2 and engine.max_inflight == 2
    assert all(len(p["input_ids"]) == 3 and "sampling_seed" not in p["sampling_params"] for p in engine.payloads)


# ------------------------------------------------------------------ profiler


def _profile_args(tmp_path, *argv):
    return parse_args(BASE + ["--use-pytorch-profiler", "--tensorboard-dir", str(tmp_path), *argv])


def _ops(path) -> set[str]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return {e["name"] for e in events if e.get("cat") == "cpu_op"}


def _work(n: int) -> None:
    x = torch.randn(8, 8)
    for _ in range(n):
        x = torch.mm(x, x).tanh()


def test_train_overall_traces_the_window_once(tmp_path):
    prof = TrainProfiler(_profile_args(tmp_path, "--profile-step-start", "1", "--profile-step-end", "3"), rank=0)
    prof.on_init_end()
    for _ in range(5):
        _work(3)
        prof.step()
    traces = list(tmp_path.glob("*.pt.trace.json.gz"))
    assert [p.name.split(".")[0] for p in traces] == ["train_overall_rank_0"]
    assert "aten::mm" in _ops(traces[0])


def test_phase_targets_trace_their_phase_in_each_step_of_the_window(tmp_path):
    prof = TrainProfiler(
        _profile_args(
            tmp_path, "--profile-step-start", "1", "--profile-step-end", "3", "--profile-target", "train_actor"
        ),
        rank=2,
    )
    prof.on_init_end()
    for _ in range(4):
        with prof.phase("train_log_probs"):  # not a target: not traced
            _work(1)
        with prof.phase("train_actor"):
            _work(2)
        prof.step()
    names = sorted(p.name.split(".")[0] for p in tmp_path.glob("*.pt.trace.json.gz"))
    assert names == ["train_actor_rank_2_step_1", "train_actor_rank_2_step_2"]
    assert all("aten::mm" in _ops(p) for p in tmp_path.glob("*.pt.trace.json.gz"))


def test_without_the_flag_nothing_is_traced(tmp_path):
    prof = TrainProfiler(
        parse_args(BASE + ["--tensorboard-dir", str(tmp_path), "--profile-step-start", "0", "--profile-step-end", "1"]),
        rank=0,
    )
    prof.on_init_end()
    with prof.phase("train_actor"):
        _work(1)
    prof.step()
    assert not list(tmp_path.iterdir())
