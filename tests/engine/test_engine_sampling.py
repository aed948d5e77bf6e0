"""The batched sampler on its own (no server): frequencies, truncation, seeds, log-probs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slime.engine.sampling import BadRequest, BatchSampler, SamplingParams


def row(seed=None, **kw):
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SimpleNamespace(params=SamplingParams(**kw), generator=gen)


PROBS = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05, 0.0])
LOGITS = torch.log(PROBS + 1e-30)


def frequencies(rows, n=6000, suppress=None):
    s = BatchSampler(rows, PROBS.numel(), torch.Generator().manual_seed(0))
    logits = LOGITS.unsqueeze(0).repeat(len(rows), 1)
    counts = torch.zeros(len(rows), PROBS.numel())
    for _ in range(n):
        t, _ = s.sample(logits, suppress)
        counts[torch.arange(len(rows)), t] += 1
    return counts / n


def test_sampling_frequencies_and_truncation():
    f = frequencies(
        [
            row(temperature=1.0),
            row(temperature=1.0, top_k=2),
            row(temperature=1.0, top_p=0.8),
            row(temperature=0.0),
            row(temperature=1.0, min_p=0.5),
        ]
    )
    assert torch.allclose(f[0], PROBS, atol=0.02)
    assert torch.allclose(f[1], torch.tensor([4 / 7, 3 / 7, 0, 0, 0, 0]), atol=0.02)
    assert torch.allclose(f[2], torch.tensor([0.4, 0.3, 0.15, 0, 0, 0]) / 0.85, atol=0.02)
    assert f[3, 0] == 1.0
    assert torch.allclose(f[4], torch.tensor([4 / 7, 3 / 7, 0, 0, 0, 0]), atol=0.02)
    assert f[:, 5].sum() == 0  # a zero-probability token is never drawn


def test_suppressed_tokens_are_never_drawn_but_logprobs_are_untouched():
    rows = [row(temperature=1.0), row(temperature=0.0)]
    sup = torch.zeros(2, 6, dtype=torch.bool)
    sup[:, 0] = True
    f = frequencies(rows, n=2000, suppress=sup)
    assert f[:, 0].sum() == 0 and f[1, 1] == 1.0
    s = BatchSampler(rows, 6, torch.Generator().manual_seed(0))
    logits = LOGITS.unsqueeze(0).repeat(2, 1)
    tok, lp = s.sample(logits, sup)
    want = torch.log_softmax(logits, -1).gather(1, tok.unsqueeze(1)).squeeze(1)
    assert torch.allclose(lp, want)


def test_logprob_uses_temperature_only():
    rows = [row(temperature=0.5, top_k=1), row(temperature=2.0, top_p=0.5)]
    s = BatchSampler(rows, 6, torch.Generator().manual_seed(0))
    logits = LOGITS.unsqueeze(0).repeat(2, 1)
    tok, lp = s.sample(logits)
    for i, t in enumerate([0.5, 2.0]):
        assert lp[i].item() == pytest.approx(torch.log_softmax(LOGITS / t, -1)[tok[i]].item(), abs=1e-6)


def test_seeded_rows_do_not_depend_on_the_batch():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))

    def draw(rows, idx, steps=20):
        s = BatchSampler(rows, 50, torch.Generator().manual_seed(99))
        return [s.sample(logits[: len(rows)])[0][idx].item() for _ in range(steps)]

    alone = draw([row(seed=7, temperature=1.0)], 0)
    with_others = draw([row(temperature=1.0), row(seed=7, temperature=1.0), row(temperature=0.0)], 1)
    assert alone == draw([row(seed=7, temperature=1.0)], 0)
    # same seed, same logits row -> same tokens wherever the row sits
    logits[1] = logits[0]
    assert draw([row(temperature=1.0), row(seed=7, temperature=1.0), row(temperature=0.0)], 1) == alone
    assert len(set(with_others)) > 1


def test_param_validation_messages():
    with pytest.raises(BadRequest, match="unknown sampling parameter"):
        SamplingParams.from_dict({"temprature": 1}, vocab_size=10)
    with pytest.raises(BadRequest, match="top_k"):
        SamplingParams.from_dict({"top_k": 0}, vocab_size=10)
    with pytest.raises(BadRequest, match="min_new_tokens"):
        SamplingParams.from_dict({"min_new_tokens": 5, "max_new_tokens": 2}, vocab_size=10)
    with pytest.raises(BadRequest, match="repetition_penalty"):
        SamplingParams.from_dict({"repetition_penalty": 1.2}, vocab_size=10)
    p = SamplingParams.from_dict(
        {
            "stop": "x",
            "stop_token_ids": 3,
            "repetition_penalty": 1.0,
            "spaces_between_special_tokens": False,
            "top_k": None,
        },
        vocab_size=10,
    )
    assert p.stop == ["x"] and p.stop_token_ids == [3] and p.top_k == -1
