"""On-policy distillation with the teacher served as a frozen `--sglang-config` model (`teacher`,
`update_weights: false`): slime's hooks ask its router (no `--rm-url`), it is never synced, and
the distillation term sees the student drift from it. The teacher is the student's own start
(`--hf-checkpoint`): at rollout 0 the two agree, so the reverse KL is 0 up to the engines'
rounding; after one update of the student it is not, while the teacher's weights stay put."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples/llm_judge/opd_sglang_config.yaml"  # the documented example


def test_the_teacher_model_is_asked_never_synced_and_the_student_drifts_from_it(
    ray_cluster, tiny_model_dir, task_dir, tmp_path
):
    from slime.arguments import parse_args
    from slime.train import train
    from tests.helpers import short_run_argv

    run_dir = tmp_path / "run"
    args = parse_args(
        short_run_argv(
            tiny_model_dir,
            task_dir,
            run_dir,
            *("--sglang-config", str(CONFIG), "--rollout-num-gpus", "2", "--use-opd", "--opd-type", "sglang"),
            *("--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func"),
            *("--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards"),
            *("--custom-rollout-log-function-path", "tests.examples.test_llm_judge.fingerprint"),
            *("--lr", "3e-2"),
        )
    )
    assert args.rm_url is None  # the hooks find the teacher through --sglang-config
    train(args)
    rows = [json.loads(line) for line in (run_dir / "fingerprints.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1]
    first, last = rows
    assert set(first["routers"]) == {"actor", "teacher"} and first["routers"]["actor"] != first["routers"]["teacher"]
    assert first["frozen_rows"] >= 4 and last["frozen_rows"] > first["frozen_rows"]  # every sample asked it
    assert first["teacher"] == last["teacher"] and first["teacher_version"] == last["teacher_version"]
    assert first["actor_version"] != last["actor_version"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and not any(m.get("rollout/status/failed") for m in metrics)
    assert all(m["rollout/raw_reward"] == 0.0 for m in metrics)  # the signal is the distillation term alone
    assert abs(metrics[0]["train/opd_reverse_kl"]) < 1e-4  # the same weights on both sides
    assert abs(metrics[1]["train/opd_reverse_kl"]) > 10 * abs(metrics[0]["train/opd_reverse_kl"])
