"""A short real run (Ray, engine server, trainer, weight sync) per estimator family and for SFT, in
the session's shared Ray cluster.

GRPO's run is tests/e2e/test_train_run.py's. The other critic-free estimators share one run:
REINFORCE++ with the options that only a real rollout feeds (advantage whitening, the KL loss and
the KL in the reward against the reference, TIS on the engine's log-probs, the DAPO overlong
penalty on the rollout's response lengths). GSPO, RLOO, CISPO and REINFORCE++-baseline differ from
these only in the rollout's group reward step (tests/rollout/test_reward_post_process.py, against
plain loops) and inside the trainer's estimator and loss, which tests/backends/test_train_algorithms.py
runs in the real TrainActor (first step on policy, every micro-batch layout) and
tests/algorithms/test_algorithm_suite.py checks against references. PPO (the critic) has its own.
"""

import json
import math

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]

RUNS = {
    "reinforce_plus_plus": [
        "--advantage-estimator",
        "reinforce_plus_plus",
        "--normalize-advantages",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.01",
        "--kl-coef",
        "0.01",
        "--use-tis",
        "--overlong-buffer-len",
        "4",
        # LoRA: the reference is the base with the adapter off; the engine gets the merged weights
        "--enable-lora",
        "--lora-rank",
        "8",
        "--check-weight-update-equal",
    ],
    "ppo": ["--advantage-estimator", "ppo", "--lambd", "0.95", "--critic-lr", "1e-3"],
}


def _run(argv):
    from slime.arguments import parse_args
    from slime.train import train

    args = parse_args(argv)
    train(args)
    return [json.loads(line) for line in (args.run_dir and open(f"{args.run_dir}/metrics.jsonl")).read().splitlines()]


@pytest.mark.parametrize("name", list(RUNS))
def test_estimator_short_run_has_finite_metrics(name, tiny_model_dir, task_dir, tmp_path):
    rows = _run(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rollout-shuffle",
            "--custom-rm-path",
            "tests.e2e.hooks.digit_reward",
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "8",
            "--global-batch-size",
            "8",
            "--micro-batch-size",
            "8",
            "--lr",
            "1e-3",
            "--colocate",
            "--run-dir",
            str(tmp_path / "run"),
            *RUNS[name],
        ]
    )
    assert len(rows) == 2
    keys = [
        "train/pg_loss",
        "train/pg_clipfrac",
        "train/ppo_kl",
        "train/entropy_loss",
        "train/grad_norm",
        "train/lr",
        "rollout/advantages",
        "train/train_rollout_logprob_abs_diff",
    ]
    keys += {
        "ppo": ["train/value_loss", "train/value_clipfrac", "rollout/values"],
        "reinforce_plus_plus": [
            "train/kl_loss",
            "train/tis",
            "train/tis_clipfrac",
            "rollout/overlong_penalty",
            "train/weight_sync_logprob_abs_diff",
        ],
    }[name]
    for row in rows:
        for key in keys:
            assert key in row and math.isfinite(row[key]), (name, key)
    assert rows[0]["train/train_rollout_logprob_abs_diff"] < 1e-4
    if name == "reinforce_plus_plus":  # the engine's log-probs of the merged LoRA weights are the trainer's
        assert max(r["train/weight_sync_logprob_abs_diff"] for r in rows) < 1e-5


def test_sft_short_run_has_finite_loss(tiny_model_dir, task_dir, tmp_path):
    rows = _run(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "sft.jsonl"),
            "--input-key",
            "messages",
            "--loss-type",
            "sft_loss",
            "--rollout-max-response-len",
            "64",
            "--rollout-function-path",
            "slime.rollout.sft_rollout.generate_rollout",
            "--num-rollout",
            "3",
            "--rollout-batch-size",
            "16",
            "--global-batch-size",
            "16",
            "--micro-batch-size",
            "16",
            "--use-dynamic-batch-size",
            "--max-tokens-per-gpu",
            "256",
            "--lr",
            "3e-3",
            "--lr-decay-style",
            "cosine",
            "--colocate",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert len(rows) == 3
    losses = [r["train/loss"] for r in rows]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
