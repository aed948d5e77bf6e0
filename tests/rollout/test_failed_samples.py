"""FAILED samples stay out of the statistics: a reward that raises for 1 sample in 10 leaves those
samples FAILED and counted; the group mean and std (GRPO, Dr.GRPO, RLOO), advantage whitening and
the loss average are those of the samples that did succeed (plain-Python references); a group left
with fewer than two valid samples is dropped and counted."""

from __future__ import annotations

import asyncio
import copy
import statistics

import pytest
import torch

from slime.algorithms.advantages import drop_thin_groups, group_normalize_rewards, masked_whiten, rloo_rewards
from slime.ray.rollout import check_failed_samples
from slime.rollout import sglang_rollout
from slime.rollout.train_data import rollout_metrics, samples_to_train_data
from slime.utils.types import Sample
from tests.helpers import make_args, stub_generate_state

EPS = 1e-6


def _ref_grpo(rewards, ok, std=True):
    """By hand: mean and unbiased std over the valid rewards; an invalid sample gets 0."""
    kept = [r for r, v in zip(rewards, ok, strict=True) if v]
    mean = statistics.fmean(kept) if kept else 0.0
    sd = statistics.stdev(kept) if len(kept) > 1 else 0.0
    return [((r - mean) / (sd + EPS) if std else r - mean) if v else 0.0 for r, v in zip(rewards, ok, strict=True)]


def _ref_rloo(rewards, ok):
    out = []
    for i, (r, v) in enumerate(zip(rewards, ok, strict=True)):
        others = [x for j, (x, w) in enumerate(zip(rewards, ok, strict=True)) if w and j != i]
        out.append(r - statistics.fmean(others) if v and others else 0.0)
    return out


GROUPS = [
    ([0.2, 0.0, 0.9, 0.4], [True, False, True, True]),
    ([1.0, 1.0, 0.0, 0.5], [True, True, True, True]),
    ([0.3, 0.7, 0.1, 0.6], [False, True, False, True]),
    ([0.5, 0.2, 0.8, 0.9], [False, False, True, False]),
]


@pytest.mark.parametrize("std", [True, False])
def test_group_statistics_skip_invalid_samples(std):
    rewards = [r for g, _ in GROUPS for r in g]
    valid = [v for _, g in GROUPS for v in g]
    got = group_normalize_rewards(torch.tensor(rewards, dtype=torch.float64), 4, std_normalization=std, valid=valid)
    want = [x for g, ok in GROUPS for x in _ref_grpo(g, ok, std)]
    assert got.tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)
    got = rloo_rewards(torch.tensor(rewards, dtype=torch.float64), 4, valid=valid)
    assert got.tolist() == pytest.approx([x for g, ok in GROUPS for x in _ref_rloo(g, ok)], rel=1e-9, abs=1e-12)
    # all valid: exactly the unmasked computation
    full = torch.tensor(rewards)
    assert torch.equal(group_normalize_rewards(full, 4, valid=[True] * 16), group_normalize_rewards(full, 4))


def test_thin_groups_are_dropped_and_counted():
    valid = [v for _, g in GROUPS for v in g]
    kept, dropped = drop_thin_groups(valid, 4)
    assert dropped == 1  # the last group has one valid sample
    assert kept.tolist() == valid[:12] + [False] * 4
    assert drop_thin_groups([False] * 4 + [True] * 4, 4)[1] == 1  # a group with none is dropped too


def test_whitening_ignores_samples_with_zero_masks():
    adv = [torch.tensor([1.0, 2.0]), torch.tensor([5.0, 7.0, 9.0]), torch.tensor([-1.0])]
    masks = [torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0])]  # sample 1 FAILED
    got = masked_whiten(torch.cat(adv), torch.cat(masks))
    kept = [1.0, 2.0, -1.0]
    mean, var = statistics.fmean(kept), statistics.variance(kept)  # unbiased, as slime's
    assert got[torch.cat(masks).bool()].tolist() == pytest.approx(
        [(x - mean) / (var + 1e-8) ** 0.5 for x in kept], rel=1e-5
    )


# ---------------------------------------------------------------- a reward that raises for 1 in 10


@pytest.fixture
def rollout(monkeypatch):
    def run(n_groups, n):
        args = make_args(
            rm_type="math",
            rollout_batch_size=n_groups,
            n_samples_per_prompt=n,
            custom_generate_function_path="tests.contracts.hooks.custom_generate",
            custom_rm_path="tests.e2e.hooks.flaky_digit_reward",
        )
        stub_generate_state(monkeypatch, args)
        groups = [
            [Sample(group_index=k, index=k * n + j, prompt="p", tokens=[9], metadata={}) for j in range(n)]
            for k in range(n_groups)
        ]
        for g in groups:
            asyncio.run(sglang_rollout.generate_and_rm_group(args, g, {"max_new_tokens": 4}))
        return args, groups

    yield run
    sglang_rollout.GenerateState.reset()


def _digits(s):
    return sum(c.isdigit() for c in s.response) / max(1, len(s.response))


def test_a_reward_that_raises_for_one_sample_in_ten(rollout):
    args, groups = rollout(10, 4)
    samples = [s for g in groups for s in g]
    failed = [s.index for s in samples if s.status == Sample.Status.FAILED]
    assert failed == [3, 13, 23, 33]
    assert all("reward service unavailable" in samples[i].metadata["error"] for i in failed)
    check_failed_samples(groups, 0, args.max_failed_sample_ratio)  # 10%: the run goes on
    data = samples_to_train_data(args, groups)
    metrics = rollout_metrics(args, groups, data)
    assert metrics["rollout/status/failed"] == 4 and metrics["rollout/dropped_groups"] == 0
    ok = [s.status != Sample.Status.FAILED for s in samples]
    # the mean reward is the mean of the rewards that exist
    assert metrics["rollout/raw_reward"] == pytest.approx(
        statistics.fmean(_digits(s) for s in samples if s.status != Sample.Status.FAILED)
    )
    # GRPO per group over the samples that were scored; the FAILED ones: advantage 0, never trained on
    for k, g in enumerate(groups):
        want = _ref_grpo(
            [_digits(s) if o else 0.0 for s, o in zip(g, ok[4 * k : 4 * k + 4], strict=True)], ok[4 * k : 4 * k + 4]
        )
        assert data["rewards"][4 * k : 4 * k + 4] == pytest.approx(want, rel=1e-5, abs=1e-5)
    for i in range(len(samples)):
        assert data["excluded"][i] == int(not ok[i])
        assert (sum(data["loss_masks"][i]) == 0) == (not ok[i])


def test_a_group_with_too_few_valid_samples_is_dropped(rollout):
    args, groups = rollout(2, 2)  # indices 0..3: sample 3 fails, its group keeps one valid sample
    data = samples_to_train_data(args, groups)
    assert data["excluded"] == [0, 0, 1, 1] and data["rewards"][2:] == [0.0, 0.0]
    assert sum(data["loss_masks"][2]) == 0  # its valid sample is not trained on either
    assert rollout_metrics(args, groups, data)["rollout/dropped_groups"] == 1


# ---------------------------------------------------------------- the loss average skips them


def test_the_loss_average_is_over_the_valid_samples(tiny_model_dir, tmp_path):
    """One sample of four FAILED (zero mask, `excluded`): the policy loss equals that of the three
    valid samples trained alone (without the exclusion it would be 3/4 of it)."""
    from slime.arguments import parse_args
    from slime.backends.torch.actor import TrainActor

    def actor(n):
        args = parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--rollout-batch-size",
                str(n),
                "--n-samples-per-prompt",
                "1",
                "--num-rollout",
                "1",
                "--lr",
                "1e-2",
                "--micro-batch-size",
                "1",
                "--run-dir",
                str(tmp_path / str(n)),
            ]
        )
        a = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
        a.init()
        return a

    valid = {
        "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11, 3], [12, 13, 16, 17, 18, 19]],
        "response_lengths": [2, 3, 3],
        "loss_masks": [[1, 1], [1, 0, 1], [1, 1, 1]],
        "rewards": [1.0, -0.3, 0.5],
    }
    with_failed = copy.deepcopy(valid)
    with_failed["tokens"].insert(2, [12, 13, 14, 15])
    with_failed["response_lengths"].insert(2, 2)
    with_failed["loss_masks"].insert(2, [0, 0])
    with_failed["rewards"].insert(2, 0.0)
    with_failed["excluded"] = [0, 0, 1, 0]
    alone = actor(3).train(0, valid)
    mixed = actor(4).train(0, with_failed)
    assert mixed["train/pg_loss"] == pytest.approx(alone["train/pg_loss"], rel=1e-5)
    assert abs(alone["train/pg_loss"]) > 1e-3


def test_failures_are_one_line_per_distinct_error_with_the_tracebacks_in_a_file(tmp_path, caplog):
    """A reward that raises on 40 samples and another error on 3: two lines (with counts) and a
    header naming failures.log, which holds the first traceback of each, not 43."""
    import logging

    from slime.rollout.failure_report import FAILURES_LOG, report_failures

    def failed(error: str, tb: str) -> Sample:
        s = Sample(status=Sample.Status.FAILED)
        s.metadata.update(error=error, traceback=tb)
        return s

    samples = [failed("reward: ValueError: boom", f"Traceback boom {i}") for i in range(40)]
    samples += [failed("generate: KeyError: 'x'", f"Traceback key {i}") for i in range(3)]
    samples += [Sample(status=Sample.Status.COMPLETED) for _ in range(7)]
    args = make_args(run_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="slime"):
        report_failures(args, samples, "rollout 4")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"rollout 4: 43 of 50 samples FAILED (first traceback of each in {tmp_path / FAILURES_LOG})",
        "  40 x reward: ValueError: boom",
        "  3 x generate: KeyError: 'x'",
    ]
    log = (tmp_path / FAILURES_LOG).read_text()
    assert "Traceback boom 0" in log and "Traceback key 0" in log
    assert "Traceback boom 1" not in log and log.count("--- ") == 2
    caplog.clear()
    report_failures(args, samples[-7:], "rollout 5")  # nothing failed: nothing said
    assert not caplog.records
