"""Debug paths and CI checks in real runs: one normal run under --ci-test that
dumps its details and grad norms, its replay with --load-debug-rollout-data (train only, no engine),
which gives the same train metrics until a tampered grad norm stops it with a report, and a
rollout-only run without a trainer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from slime.errors import SlimeError

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

# what a replay must reproduce exactly: the loss and its parts, KL, grad norm, mismatch metrics
TRAIN_KEYS = (
    "train/loss",
    "train/pg_loss",
    "train/entropy_loss",
    "train/ppo_kl",
    "train/pg_clipfrac",
    "train/kl_loss",
    "train/grad_norm",
    "train/mis_kl",
    "train/train_rollout_logprob_abs_diff",
    "rollout/advantages",
    "rollout/raw_reward",
)


def _argv(model: Path, task: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(task / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--custom-rm-path",
        "tests.e2e.hooks.digit_reward",
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--lr",
        "1e-3",
        "--colocate",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.01",
        "--ci-test",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def _rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["rollout_id"]: r for r in rows}


def _run(argv: list[str]):
    """One run in the Ray session the previous one started (as the stages of a job share it)."""
    from slime.arguments import parse_args
    from slime.train import train

    args = parse_args(argv)
    try:
        return args, train(args), None
    except SlimeError as e:
        return args, None, str(getattr(e, "cause", None) or e)


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    return _three_runs(tiny_model_dir, task_dir, tmp_path_factory.mktemp("debug"))


def _three_runs(tiny_model_dir, task_dir, root):
    dump, norms = root / "dump", root / "grad_norms"
    # 1. a normal run under --ci-test: details dumped, grad norms saved, mismatch metrics on
    original = _run(
        _argv(
            tiny_model_dir,
            task_dir,
            root / "original",
            "--dump-details",
            str(dump),
            "--get-mismatch-metrics",
            "--ci-save-grad-norm",
            str(norms / "{rollout_id}_{step_id}.pt"),
        )
    )
    # 2. its replay, train only; the saved grad norm of rollout 2's second step is tampered with
    tampered = root / "grad_norms_tampered"
    shutil.copytree(norms, tampered)
    torch.save(torch.load(norms / "2_1.pt") * 2 + 1, tampered / "2_1.pt")
    replay = _run(
        _argv(
            tiny_model_dir,
            task_dir,
            root / "replay",
            "--get-mismatch-metrics",
            "--load-debug-rollout-data",
            str(dump / "rollout_data" / "{rollout_id}.pt"),
            "--ci-load-grad-norm",
            str(tampered / "{rollout_id}_{step_id}.pt"),
        )
    )
    # 3. rollouts only: constructing a trainer would fail the run
    from slime import train as train_module

    class NoTrainer:
        def __init__(self, *a, **k):
            raise AssertionError("--debug-rollout-only started a trainer")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_module, "RayTrainGroup", NoTrainer)
        rollout_only = _run(
            _argv(
                tiny_model_dir,
                task_dir,
                root / "rollout_only",
                "--debug-rollout-only",
                "--num-rollout",
                "1",
                "--save-debug-rollout-data",
                str(root / "rollout_only_data" / "{rollout_id}.pt"),
            )
        )
    return {"root": root, "dump": dump, "original": original, "replay": replay, "rollout_only": rollout_only}


def test_ci_test_passes_on_a_normal_run_and_the_details_are_readable(runs):
    args, last, error = runs["original"]
    assert error is None and last
    run_dir = Path(args.run_dir)
    assert not (run_dir / "ci_failure.json").exists()
    rows = _rows(run_dir)
    assert sorted(rows) == [1, 2, 3]
    for row in rows.values():  # the step-0 values the checks saw are averaged with step 1's here
        assert {"train/ppo_kl", "train/kl_loss", "train/mis_kl", "train/train_rollout_logprob_abs_diff"} <= set(row)
    dump = runs["dump"]
    for rollout_id in range(3):
        saved = torch.load(dump / "rollout_data" / f"{rollout_id}.pt", weights_only=False)
        assert saved["rollout_id"] == rollout_id and len(saved["samples"]) == 8
        train = torch.load(dump / "train_data" / f"{rollout_id}.pt", weights_only=False)
        assert [s["sample_index"] for s in train["samples"]] == list(range(8))
        assert {"log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "reward"} <= set(train["samples"][0])
    records = [json.loads(line) for line in (dump / "rollout_data" / "0.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {"prompt", "response", "reward", "status"} <= set(records[0])
    train_records = [json.loads(line) for line in (dump / "train_data" / "0.jsonl").read_text().splitlines()]
    assert len(train_records) == 8 and "advantages_mean" in train_records[0]


def test_replay_of_saved_rollouts_gives_the_same_train_metrics_then_a_failed_check_stops_it(runs):
    original_args, _, _ = runs["original"]
    args, last, error = runs["replay"]
    assert args.debug_train_only
    run_dir = Path(args.run_dir)
    assert not list((run_dir / "logs").glob("engine_*.log")) and list(
        Path(original_args.run_dir, "logs").glob("engine_*.log")
    )
    # the run stopped at the tampered step, with a report
    assert error is not None and "--ci-test check failed: --ci-load-grad-norm at rollout 2 step 1" in error
    report = json.loads((run_dir / "ci_failure.json").read_text())
    assert report["where"] == "rollout 2 step 1" and "differs from the saved" in report["detail"]
    # until then, every step as in the original (the untampered grad norms were checked within 1% too)
    original, replay = _rows(Path(original_args.run_dir)), _rows(run_dir)
    assert sorted(replay) == [1, 2]
    for step in (1, 2):
        for key in TRAIN_KEYS:
            assert replay[step][key] == original[step][key], (step, key, replay[step][key], original[step][key])


def test_mismatch_metrics_match_an_independent_computation(runs, tiny_model_dir):
    """Rollout 0 of the original run: the engine's log-probs (saved) against the initial model's,
    computed here with transformers, unpadded, one sample at a time."""
    from transformers import AutoModelForCausalLM

    args, _, _ = runs["original"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    samples = torch.load(runs["dump"] / "rollout_data" / "0.pt", weights_only=False)["samples"]
    kl, k3, abs_diff, train_ppl, rollout_ppl, tokens = [], [], [], [], [], 0.0
    abs_sum = 0.0
    for s in samples:
        ids = torch.tensor([s["tokens"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / args.rollout_temperature
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0][-s["response_length"] :].tolist()
        rollout = s["rollout_log_probs"]
        mask = s["loss_mask"] or [1] * s["response_length"]
        keep = [i for i, m in enumerate(mask) if m]
        n = len(keep)
        kl.append(sum(rollout[i] - lp[i] for i in keep) / n)
        k3.append(sum(torch.exp(torch.tensor(lp[i] - rollout[i])).item() - (lp[i] - rollout[i]) - 1 for i in keep) / n)
        train_ppl.append(-sum(lp[i] for i in keep) / n)
        rollout_ppl.append(-sum(rollout[i] for i in keep) / n)
        abs_diff.append(abs(sum(rollout[i] for i in keep) / n - sum(lp[i] for i in keep) / n))
        abs_sum += sum(abs(lp[i] - rollout[i]) for i in keep)
        tokens += n
    row = _rows(Path(args.run_dir))[1]
    # each step's value is the mean over its samples; the row averages two equal steps. Engine and
    # trainer agree to ~1e-7 here, so the differences are checked to 1e-6 and the perplexities closely.
    for key, values in (
        ("train/mis_kl", kl),
        ("train/mis_k3_kl", k3),
        ("train/mis_training_log_ppl", train_ppl),
        ("train/mis_rollout_log_ppl", rollout_ppl),
        ("train/mis_log_ppl_abs_diff", abs_diff),
    ):
        assert row[key] == pytest.approx(sum(values) / len(values), rel=1e-4, abs=1e-6), key
    assert row["train/train_rollout_logprob_abs_diff"] == pytest.approx(abs_sum / tokens, rel=1e-4, abs=1e-6)


def test_rollout_only_run_makes_rollout_data_and_metrics_without_a_trainer(runs):
    args, last, error = runs["rollout_only"]
    assert error is None, error
    row = _rows(Path(args.run_dir))[1]
    assert row["rollout/num_samples"] == 8 and "rollout/raw_reward" in row
    assert not [k for k in row if k.startswith("train/")]
    saved = torch.load(runs["root"] / "rollout_only_data" / "0.pt", weights_only=False)
    assert len(saved["samples"]) == 8 and all(s["rollout_log_probs"] for s in saved["samples"])
    assert not Path(args.save, "latest_checkpointed_iteration.txt").exists()  # nothing trained, nothing saved


def test_saved_rollouts_of_another_batch_shape_stop_before_the_run(runs, tiny_model_dir, task_dir, capsys):
    from slime.train import main

    argv = _argv(
        tiny_model_dir,
        task_dir,
        runs["root"] / "bad",
        "--rollout-batch-size",
        "2",
        "--load-debug-rollout-data",
        str(runs["dump"] / "rollout_data" / "{rollout_id}.pt"),
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds 8 samples, but this run's rollout is --rollout-batch-size 2 x --n-samples-per-prompt 2 = 4" in err
    assert not (runs["root"] / "bad" / "metrics.jsonl").exists()
