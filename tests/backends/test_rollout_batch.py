"""The typed rollout batch: every per-sample column is one list indexed by sample (this rank's
samples, in training order), `pack` takes only that shape, and the batch is built without
touching the rollout's data."""

from __future__ import annotations

import copy

import pytest
import torch

from slime.backends.torch.batching import pack
from slime.backends.torch.rollout_batch import RolloutBatch

DATA = {
    "tokens": [[5, 6, 7], [5, 6, 8, 9], [9, 6, 7], [9, 6, 8, 1, 2]],
    "response_lengths": [1, 2, 1, 3],
    "loss_masks": [[1], [1, 0], [1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
    "raw_reward": [1.0, 0.0, 1.0, 0.0],
    "excluded": [0, 1, 0, 0],
    "rollout_log_probs": [[-1.0], [-2.0, -3.0], [-4.0], [-5.0, -6.0, -7.0]],
}


def test_every_column_is_a_list_of_this_ranks_samples_in_training_order():
    data = copy.deepcopy(DATA)
    batch = RolloutBatch.from_rollout(data, [3, 1])
    assert data == DATA  # the rollout's data is read, never written
    assert batch.indices == [3, 1] and len(batch) == 2 and batch.positions() == [0, 1]
    assert batch.tokens == [DATA["tokens"][3], DATA["tokens"][1]]
    assert batch.rollout_mask_sums == [3.0, 1.0]  # the delivered masks' totals
    assert batch.excluded == [0, 1] and batch.raw_reward == [0.0, 0.0]
    assert batch.teacher_log_probs is None and batch.advantages is None  # not delivered / not computed
    for name in ("tokens", "response_lengths", "loss_masks", "rewards", "rollout_log_probs", "rollout_mask_sums"):
        assert isinstance(getattr(batch, name), list) and len(getattr(batch, name)) == len(batch), name
    assert pack(batch.rollout_log_probs, batch.positions()).tolist() == [-5.0, -6.0, -7.0, -2.0, -3.0]
    assert batch.sequences == {
        "tokens": batch.tokens,
        "response_lengths": batch.response_lengths,
        "loss_masks": batch.loss_masks,
    }


def test_no_excluded_samples_is_no_excluded_column():
    data = {**copy.deepcopy(DATA), "excluded": []}
    assert RolloutBatch.from_rollout(data, [0, 1]).excluded is None


def test_a_column_keyed_by_sample_is_refused_naming_it():
    batch = RolloutBatch.from_rollout(DATA, [0, 2])
    with pytest.raises(TypeError, match="column 'advantages' must be a list with one entry per sample"):
        batch.advantages = {0: torch.zeros(1), 2: torch.zeros(1)}
    with pytest.raises(TypeError, match="column 'rewards' must be a list"):
        RolloutBatch(
            indices=[0],
            tokens=[[1, 2]],
            response_lengths=[1],
            loss_masks=[[1]],
            rewards={0: 1.0},
            rollout_mask_sums=[1.0],
        )
    with pytest.raises(ValueError, match="column 'returns' has 3 entries for 2 samples"):
        batch.returns = [torch.zeros(1)] * 3


def test_pack_takes_a_list_per_sample_and_refuses_a_dict():
    column = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    assert pack(column, [1, 0]).tolist() == [3.0, 1.0, 2.0]
    with pytest.raises(TypeError, match=r"per-sample column must be a list .* got dict \(keyed by sample"):
        pack(dict(enumerate(column)), [1, 0])
    with pytest.raises(TypeError, match="got Tensor"):
        pack(torch.zeros(2, 3), [0])
