"""slime's trainer-side observability helpers (train_metric_utils, train_data_utils,
rollout_data_utils) in one process: each result against a hand computation or the file read back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from slime.errors import SlimeError
from slime.utils.types import Sample
from tests.helpers import make_args


def test_train_metric_reductions_by_hand(tmp_path):
    from slime.observability import train_metric_utils as T

    mbs = [{"keys": ["loss", "kl"], "values": torch.tensor([4.0, 2.0, 0.4])}]
    mbs.append({"keys": ["loss", "kl"], "values": torch.tensor([6.0, 3.0, 0.6])})
    per_token = T.reduce_train_step_metrics(
        mbs, calculate_per_token_loss=True, step_global_batch_size=2, cp_size=1, dp_with_cp_group=None
    )
    assert per_token == pytest.approx({"loss": 5.0 / 10, "kl": 1.0 / 10})
    per_rollout = T.reduce_train_step_metrics(
        mbs, calculate_per_token_loss=False, step_global_batch_size=2, cp_size=1, dp_with_cp_group=None
    )
    assert per_rollout == pytest.approx({"loss": 2.5, "kl": 0.5})
    assert T.rollout_log_metric_contribution(1.5, cp_size=2, num_rollouts_in_rollout=8, dp_size=4) == (3.0, 2.0)
    reduced = T.gather_and_reduce_log_dict({"a": (3.0, 2.0), "b": 5.0}, dp_size=1, dp_src_rank=0, dp_group=None)
    assert reduced == {"a": 1.5, "b": 5.0}

    args = make_args(
        "--run-dir",
        str(tmp_path),
        "--n-samples-per-prompt",
        "2",
        "--rollout-batch-size",
        "2",
        "--rollout-max-response-len",
        "3",
    )
    out = T.log_passrate(5, args, {"raw_reward": [1, 0, 0, 0]})
    assert out["passrate/pass@1"] == pytest.approx(0.25) and out["passrate/pass@2"] == pytest.approx(0.5)
    record = json.loads((tmp_path / "hook_metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 5 and record["passrate/pass@2"] == pytest.approx(0.5)
    multi = T.log_multi_turn_data(5, args, {"round_number": [1, 3], "loss_masks": [torch.tensor([1, 0, 1])]})
    assert multi["multi_turn/multi_turn_metric/round_number_mean"] == 2.0
    assert multi["multi_turn/wo_obs_response_length/response_length_mean"] == 2.0
    assert multi["multi_turn/raw_response_length/response_length_clip_ratio"] == 1.0
    with pytest.raises(SlimeError, match="Megatron"):
        T.log_perf_data(0, args)


def test_train_debug_dump_is_slimes_format(tmp_path):
    from slime.observability.train_data_utils import restore_context_parallel_fields_to_cpu, save_debug_train_data

    data = {
        "total_lengths": [5, 4],
        "response_lengths": [2, 3],
        "log_probs": [torch.tensor([-0.1, -0.2]), torch.tensor([-0.3, -0.4, -0.5])],
        "partition": [1, 0],
        "raw_reward": [1.0, 0.0],
        "num_microbatches": [1],
    }
    restored = restore_context_parallel_fields_to_cpu(data, lambda t, total, resp: t, keep_restored=True)
    assert torch.equal(restored["log_probs"][1], data["log_probs"][1])
    with pytest.raises(ValueError, match="length"):
        restore_context_parallel_fields_to_cpu(data, lambda t, total, resp: t[:1], keep_restored=False)

    args = make_args("--save-debug-train-data", str(tmp_path / "train_{rollout_id}_{rank}.pt"))
    save_debug_train_data(args, rollout_id=2, rollout_data=data)
    dump = torch.load(tmp_path / "train_2_0.pt", weights_only=False)
    assert dump["format_version"] == 2 and dump["raw_reward"] == [1.0, 0.0]
    assert [s["rollout_position"] for s in dump["samples"]] == [0, 1]  # sorted by partition
    assert dump["samples"][0]["response_lengths"] == 3 and dump["dp_shards"][0]["num_microbatches"] == [1]


def test_rollout_data_utils(tmp_path):
    from slime.observability import rollout_data_utils as R

    data = {"tokens": [np.array([1, 2])], "loss_masks": [[1, 0]], "rollout_mask_sums": [2]}
    R.tensorize_rollout_data_for_training(data)
    assert data["tokens"][0].dtype == torch.long and data["loss_masks"][0].dtype == torch.int
    assert data["rollout_mask_sums"].dtype == torch.float32

    a, b = Sample(rollout_id=1), Sample(rollout_id=1)
    R.validate_rollout_id_annotated([[[a, b]]])
    with pytest.raises(AssertionError, match="rollout_id"):
        R.validate_rollout_id_annotated([[[a, Sample()]]])
    R.validate_rollout_id_annotated([[a, Sample()]])  # the usual depth: not checked

    args = make_args("--num-layers", "2", "--moe-router-topk", "2")
    R.validate_rollout_routed_experts_for_replay([torch.ones(3, 2, 2)], args)
    broken = torch.ones(3, 2, 2)
    broken[:, 1] = 0
    with pytest.raises(ValueError, match=r"MoE layers \[1\]"):
        R.validate_rollout_routed_experts_for_replay([broken], args)

    samples = [Sample(index=i, response=str(i)) for i in range(6)]
    R.save_debug_rollout_data(str(tmp_path / "r_{rollout_id}.pt"), samples, rollout_id=3, evaluation=False)
    back = R.load_debug_rollout_data(str(tmp_path / "r_{rollout_id}.pt"), rollout_id=3, subsample_ratio=0.5)
    assert [s.response for s in back] == ["0", "4", "5"]  # int(6 * 0.5) = 3: first 1, last 2


def test_the_report_links_the_run_s_timelines(tmp_path):
    from slime.observability.report import collect, render
    from slime.observability.trace_utils import save_rollout_trace, trace_span

    s = Sample(index=0, group_index=0)
    with trace_span(s, "generate"):
        pass
    save_rollout_trace(tmp_path, 0, [s])
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"rollout_id": 0, "global_step": 0, "time": 0.0}) + "\n")
    data = collect(tmp_path)
    assert data["traces"] == ["traces/rollout_0.trace.json"]
    assert '<a href="traces/rollout_0.trace.json">' in render(data)
