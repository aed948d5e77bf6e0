"""slime's on-policy distillation hooks against a real teacher engine: the teacher log-probs that
reach the train data are an independent HF forward's over prompt + response."""

from __future__ import annotations

import pytest
import torch

from slime.errors import SlimeError
from slime.rollout.on_policy_distillation import post_process_rewards, reward_func
from slime.rollout.train_data import samples_to_train_data
from slime.utils.types import Sample
from tests.engine.engine_test_utils import reference_logprobs
from tests.engine.engine_test_utils import run_async as _run
from tests.helpers import make_args


def test_teacher_log_probs_from_the_engine_match_a_reference_forward(engine, hf_model):
    args = make_args(
        rm_url=engine.url + "/generate",
        rollout_temperature=0.7,
        rollout_batch_size=2,
        custom_rm_path="slime.rollout.on_policy_distillation.reward_func",
        custom_reward_post_process_path="slime.rollout.on_policy_distillation.post_process_rewards",
    )
    prompt, responses = [5, 6, 7, 8], [[9, 10, 11], [12, 13]]
    samples = [
        Sample(
            index=i, tokens=prompt + r, response_length=len(r), loss_mask=[1] * len(r), status=Sample.Status.COMPLETED
        )
        for i, r in enumerate(responses)
    ]
    for s in samples:
        s.reward = _run(reward_func(args, s))
    raw, rewards = post_process_rewards(args, samples)
    assert raw == rewards == [0.0, 0.0] and all(s.reward == 0.0 for s in samples)
    for s, r in zip(samples, responses, strict=True):
        ref = reference_logprobs(hf_model, prompt, r, 0.7)
        assert len(s.teacher_log_probs) == len(r)
        assert max(abs(a - b) for a, b in zip(s.teacher_log_probs, ref, strict=True)) < 1e-4
    # slime's hooks may leave tensors: the train data takes either
    samples[1].teacher_log_probs = torch.tensor(samples[1].teacher_log_probs)
    data = samples_to_train_data(args, [samples])
    assert [len(t) for t in data["teacher_log_probs"]] == [3, 2]
    assert data["teacher_log_probs"][1] == pytest.approx(
        reference_logprobs(hf_model, prompt, responses[1], 0.7), abs=1e-4
    )


def test_a_failed_sample_keeps_the_column_and_a_missing_answer_is_an_error():
    args = make_args(rm_url="http://127.0.0.1:1/generate")
    failed = Sample(index=0, tokens=[1, 2, 3], response_length=2, status=Sample.Status.FAILED)
    post_process_rewards(args, [failed])
    assert failed.teacher_log_probs == [0.0, 0.0]
    with pytest.raises(SlimeError, match="no teacher answer"):
        post_process_rewards(
            args, [Sample(index=1, tokens=[1, 2], response_length=1, reward=1.0, status=Sample.Status.COMPLETED)]
        )
