"""Debug dumps and replay, CI checks and mismatch metrics, without processes:
options and their checks, the saved format, the batch-shape check, the formulas against plain loops."""

from __future__ import annotations

import json
import math

import pytest
import torch

from slime.algorithms.losses import reduce_loss
from slime.algorithms.mismatch import mismatch_metrics
from slime.arguments import parse_args
from slime.errors import SlimeError
from slime.observability import ci_checks
from slime.observability.debug_data import load_rollout_data, save_rollout_data
from slime.utils.types import Sample
from tests.helpers import make_args

BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1"]


# ------------------------------------------------------------------ options
def test_slimes_names_defaults_and_dump_details_layout(tmp_path):
    args = parse_args(BASE)
    assert (args.debug_rollout_only, args.debug_train_only, args.ci_test, args.get_mismatch_metrics) == (False,) * 4
    assert args.ci_train_rollout_logprob_abs_diff_threshold == 0.1  # slime's default
    assert args.save_debug_rollout_data is None and args.load_debug_rollout_data_subsample is None
    args = parse_args(BASE + ["--dump-details", str(tmp_path)])
    assert args.save_debug_rollout_data == f"{tmp_path}/rollout_data/{{rollout_id}}.pt"
    assert args.save_debug_train_data == f"{tmp_path}/train_data/{{rollout_id}}.pt"
    # slime: loading debug rollout data means training only
    assert parse_args(BASE + ["--load-debug-rollout-data", "r_{rollout_id}.pt"]).debug_train_only is True
    # slime: nothing to take turns with without a trainer
    assert parse_args(BASE + ["--debug-rollout-only", "--colocate"]).colocate is False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--debug-rollout-only", "--debug-train-only"], "cannot be set at the same time"),
        (["--debug-rollout-only", "--load-debug-rollout-data", "r.pt"], "--debug-rollout-only starts no trainer"),
        (["--debug-train-only"], "--debug-train-only starts no engines"),
        (
            ["--debug-train-only", "--load-debug-rollout-data", "r.pt", "--check-weight-update-equal"],
            "--check-weight-update-equal compares the engines",
        ),
        (["--debug-rollout-only", "--get-mismatch-metrics"], "--get-mismatch-metrics acts in the trainer"),
        (["--load-debug-rollout-data-subsample", "0.5"], "give that too"),
        (["--load-debug-rollout-data", "r.pt", "--load-debug-rollout-data-subsample", "1.5"], "must be in (0, 1]"),
        (["--save-debug-rollout-data", "d/{rollout}.pt"], "--save-debug-rollout-data 'd/{rollout}.pt': placeholders"),
        (["--save-debug-train-data", "a.pt", "--save-debug-rollout-data", "a.pt"], "must not be equal"),
        (["--ci-save-grad-norm", "g/{step}.pt"], "--ci-save-grad-norm"),
        (["--ci-save-grad-norm", "a", "--ci-load-grad-norm", "b"], "give one"),
        (["--ci-train-rollout-logprob-abs-diff-threshold", "-1"], "must be >= 0"),
        (
            ["--get-mismatch-metrics", "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout"],
            "SFT data",
        ),
    ],
)
def test_bad_input_stops_at_parsing_naming_the_option(argv, needle):
    with pytest.raises(SlimeError) as e:
        parse_args(BASE + argv)
    assert needle in str(e.value)


def test_train_only_with_evaluation_data_says_so_at_start_up(tmp_path):
    from slime.arguments import startup_notes

    args = parse_args(BASE + ["--load-debug-rollout-data", "r.pt", "--eval-prompt-data", "x", "e.jsonl"])
    assert any("no evaluation" in n for n in startup_notes(args))


# ------------------------------------------------------------------ save / load
def _groups(num_groups: int, n: int) -> list[list[Sample]]:
    groups = []
    for g in range(num_groups):
        groups.append(
            [
                Sample(
                    group_index=g,
                    index=g * n + j,
                    prompt=f"p{g}",
                    tokens=[1, 2, 3, 4 + j],
                    response=f"r{j}",
                    response_length=2,
                    reward=float(j),
                    loss_mask=[1, 1],
                    rollout_log_probs=[-0.1 * (j + 1), -0.2 + 1e-9 * g],
                    status=Sample.Status.COMPLETED,
                )
                for j in range(n)
            ]
        )
    return groups


def _args(tmp_path, *extra):
    return parse_args(
        BASE
        + [
            "--save-debug-rollout-data",
            str(tmp_path / "d" / "{rollout_id}.pt"),
            "--load-debug-rollout-data",
            str(tmp_path / "d" / "{rollout_id}.pt"),
            *extra,
        ]
    )


def test_saved_in_slimes_format_and_loaded_back_as_the_same_groups(tmp_path):
    args = _args(tmp_path)
    groups = _groups(2, 2)
    save_rollout_data(args, [s for g in groups for s in g], rollout_id=3)
    saved = torch.load(tmp_path / "d" / "3.pt", weights_only=False)
    assert saved["rollout_id"] == 3 and [s["index"] for s in saved["samples"]] == [0, 1, 2, 3]
    loaded = load_rollout_data(args, 3)
    assert [[s.to_dict() for s in g] for g in loaded] == [[s.to_dict() for s in g] for g in groups]
    # evaluation data goes to eval_<id>, as slime names it
    save_rollout_data(args, groups[0], rollout_id=3, evaluation=True)
    assert (tmp_path / "d" / "eval_3.pt").is_file()


def test_dump_details_writes_readable_records(tmp_path):
    args = parse_args(BASE + ["--dump-details", str(tmp_path)])
    save_rollout_data(args, [s for g in _groups(2, 2) for s in g], rollout_id=0)
    rows = [json.loads(line) for line in (tmp_path / "rollout_data" / "0.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[1]["response"] == "r1" and rows[1]["reward"] == 1.0 and rows[1]["tokens"] == 4


def test_subsample_is_slimes_rule(tmp_path):
    args = _args(
        tmp_path, "--load-debug-rollout-data-subsample", "0.5", "--global-batch-size", "2", "--rollout-batch-size", "4"
    )
    samples = [s for g in _groups(4, 2) for s in g]
    save_rollout_data(args, samples, rollout_id=0)
    k = int(len(samples) * 0.5)
    want = samples[: k // 2] + samples[-k // 2 :]  # slime's load_debug_rollout_data
    got = [s for g in load_rollout_data(args, 0) for s in g]
    assert [s.index for s in got] == [s.index for s in want] == [0, 1, 6, 7]


def test_files_that_do_not_match_the_runs_batch_stop_naming_the_mismatch(tmp_path):
    save_rollout_data(_args(tmp_path), [s for g in _groups(2, 2) for s in g], rollout_id=0)
    with pytest.raises(
        SlimeError,
        match=r"holds 4 samples, but this run's rollout is --rollout-batch-size 3 x "
        r"--n-samples-per-prompt 2 = 6 samples",
    ):
        load_rollout_data(_args(tmp_path, "--rollout-batch-size", "3", "--global-batch-size", "2"), 0)
    with pytest.raises(SlimeError, match="holds groups of 2 samples, but --n-samples-per-prompt is 4"):
        load_rollout_data(_args(tmp_path, "--rollout-batch-size", "1", "--n-samples-per-prompt", "4"), 0)
    with pytest.raises(
        SlimeError, match="keeps 2 samples, not a whole number of optimizer steps of --global-batch-size 4"
    ):
        load_rollout_data(_args(tmp_path, "--load-debug-rollout-data-subsample", "0.5"), 0)
    with pytest.raises(SlimeError, match="no file .*1.pt for rollout 1"):
        load_rollout_data(_args(tmp_path), 1)
    (tmp_path / "d" / "2.pt").write_text("not torch")
    with pytest.raises(SlimeError, match="is not saved rollout data"):
        load_rollout_data(_args(tmp_path), 2)


# ------------------------------------------------------------------ mismatch metrics
def test_mismatch_metrics_match_a_plain_loop():
    torch.manual_seed(0)
    lengths = [3, 5, 2]
    train = torch.randn(sum(lengths)) * 0.3 - 1.0
    rollout = train + torch.randn(sum(lengths)) * 0.05
    masks = [torch.tensor([1, 1, 0]), torch.tensor([1, 0, 1, 1, 1]), torch.tensor([1, 1])]
    mis = mismatch_metrics(train, rollout, lengths, masks)
    got = {k: float(reduce_loss(v, lengths, masks)) for k, v in mis.items()}

    per_sample: dict[str, list[float]] = {}
    start = 0
    for n, m in zip(lengths, masks, strict=True):
        t = train[start : start + n].tolist()
        r = rollout[start : start + n].tolist()
        keep = [i for i in range(n) if m[i]]
        mt, mr = sum(t[i] for i in keep) / len(keep), sum(r[i] for i in keep) / len(keep)
        per_sample.setdefault("mis_training_log_ppl", []).append(-mt)
        per_sample.setdefault("mis_rollout_ppl", []).append(math.exp(-mr))
        per_sample.setdefault("mis_kl", []).append(sum(r[i] - t[i] for i in keep) / len(keep))
        per_sample.setdefault("mis_k3_kl", []).append(
            sum(math.exp(t[i] - r[i]) - (t[i] - r[i]) - 1 for i in keep) / len(keep)
        )
        per_sample.setdefault("mis_log_ppl_abs_diff", []).append(abs(mr - mt))
        per_sample.setdefault("mis_chi2_token", []).append(
            sum(math.exp(2 * (t[i] - r[i])) for i in keep) / len(keep) - 1
        )
        per_sample.setdefault("mis_chi2_seq", []).append(math.exp(2 * sum(t[i] - r[i] for i in keep)) - 1)
        start += n
    for key, values in per_sample.items():
        assert got[key] == pytest.approx(sum(values) / len(values), rel=1e-5, abs=1e-7), key


# ------------------------------------------------------------------ CI checks
def test_ci_checks_pass_when_on_policy_and_stop_with_a_report_when_not(tmp_path):
    args = parse_args(BASE + ["--ci-test", "--run-dir", str(tmp_path)])
    ci_checks.check_train_step(args, 0, 0, {"train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.0})
    ci_checks.check_train_step(args, 1, 1, {"train/ppo_kl": 0.3, "train/pg_clipfrac": 0.1})  # later steps move
    ci_checks.check_logprob_diff(args, 0, {"train/train_rollout_logprob_abs_diff": 0.05})
    ci_checks.check_weight_versions(args, "2", {"http://a": "2", "http://b": "2"})
    assert not (tmp_path / "ci_failure.json").exists()

    with pytest.raises(SlimeError, match=r"first step's train/ppo_kl at rollout 2 step 0: train/ppo_kl = 0.001"):
        ci_checks.check_train_step(args, 2, 0, {"train/ppo_kl": 1e-3, "train/pg_clipfrac": 0.0})
    report = json.loads((tmp_path / "ci_failure.json").read_text())
    assert report["check"] == "first step's train/ppo_kl" and report["metrics"]["train/ppo_kl"] == 1e-3
    with pytest.raises(SlimeError, match="train/kl_loss = 0.01"):
        ci_checks.check_train_step(args, 0, 0, {"train/kl_loss": 0.01})
    with pytest.raises(SlimeError, match="exceeds --ci-train-rollout-logprob-abs-diff-threshold 0.1"):
        ci_checks.check_logprob_diff(args, 0, {"train/train_rollout_logprob_abs_diff": 0.2})
    with pytest.raises(SlimeError, match=r"engines report another version: http://b: '1'"):
        ci_checks.check_weight_versions(args, "2", {"http://a": "2", "http://b": "1"})
    # --ci-disable-kl-checker turns the on-policy checks off; without --ci-test nothing is checked
    quiet = parse_args(BASE + ["--ci-test", "--ci-disable-kl-checker"])
    ci_checks.check_train_step(quiet, 0, 0, {"train/ppo_kl": 1.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 1.0})
    ci_checks.check_weight_versions(parse_args(BASE), "2", {"http://b": "1"})


def test_grad_norms_saved_then_compared_within_slimes_tolerance(tmp_path):
    pattern = str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.pt")
    save = parse_args(BASE + ["--ci-save-grad-norm", pattern])
    ci_checks.save_or_check_grad_norm(save, 1, 0, 2.5, writer=True)
    ci_checks.save_or_check_grad_norm(save, 1, 1, 9.0, writer=False)  # only the writing rank saves
    assert torch.load(tmp_path / "gn" / "actor_1_0.pt") == 2.5 and not (tmp_path / "gn" / "actor_1_1.pt").exists()
    load = parse_args(BASE + ["--ci-load-grad-norm", pattern, "--run-dir", str(tmp_path)])
    ci_checks.save_or_check_grad_norm(load, 1, 0, 2.52, writer=True)  # within 1%
    with pytest.raises(SlimeError, match=r"grad norm 2.6 differs from the saved 2.5"):
        ci_checks.save_or_check_grad_norm(load, 1, 0, 2.6, writer=True)
    with pytest.raises(SlimeError, match="no saved grad norm"):
        ci_checks.save_or_check_grad_norm(load, 1, 1, 2.6, writer=True)


# ------------------------------------------------------------------ in the trainer (in-process, no Ray)
DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
    "rollout_log_probs": [[-5.0, -5.1], [-4.9, -5.2], [-5.3, -5.0], [-5.1, -4.8, -5.2]],
}


def _train(tiny_model_dir, tmp_path, *extra):
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "1",
            "--run-dir",
            str(tmp_path),
            "--micro-batch-size",
            "2",
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor, actor.train(0, {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in DATA.items()})


def test_trainer_mismatch_metrics_train_data_dump_and_ci_report(tiny_model_dir, tmp_path):
    plain_actor, plain = _train(tiny_model_dir, tmp_path / "plain")
    actor, metrics = _train(
        tiny_model_dir,
        tmp_path / "mis",
        "--get-mismatch-metrics",
        "--save-debug-train-data",
        str(tmp_path / "td" / "{rollout_id}_{rank}.pt"),
    )
    assert metrics["train/loss"] == plain["train/loss"]  # diagnostics only
    # the trainer's old log-probs (dumped) against the rollout's, by the plain formula
    saved = torch.load(tmp_path / "td" / "0_0.pt", weights_only=False)
    assert [s["sample_index"] for s in saved["samples"]] == [0, 1, 2, 3]
    kl = []
    for s in saved["samples"]:
        keep = [i for i, m in enumerate(s["loss_mask"]) if m]
        kl.append(sum(s["rollout_log_probs"][i] - s["log_probs"][i] for i in keep) / len(keep))
    assert metrics["train/mis_kl"] == pytest.approx(sum(kl) / len(kl), rel=1e-5)
    # --use-rollout-logprobs: the trainer's log-probs come from one more forward pass, same numbers
    _, with_rollout_lp = _train(tiny_model_dir, tmp_path / "rlp", "--get-mismatch-metrics", "--use-rollout-logprobs")
    assert with_rollout_lp["train/mis_kl"] == pytest.approx(metrics["train/mis_kl"], rel=1e-5)
    # the made-up rollout log-probs are far from the model's: --ci-test's bound stops the run with a report
    with pytest.raises(
        SlimeError,
        match="train/train_rollout_logprob_abs_diff = .* exceeds --ci-train-rollout-logprob-abs-diff-threshold 0.001",
    ):
        _train(tiny_model_dir, tmp_path / "ci", "--ci-test", "--ci-train-rollout-logprob-abs-diff-threshold", "0.001")
    assert json.loads((tmp_path / "ci" / "ci_failure.json").read_text())["where"] == "rollout 0"


def test_forge_load_replays_saved_rollouts_with_slimes_path_rules(tmp_path):
    """slime.rollout.forge_load: {rollout_id} files, the 0.pt fallback for training (not eval),
    eval_<id>.pt for evaluation, a literal file reused for every rollout; engines are not skipped."""
    import torch

    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
    from slime.rollout.forge_load import generate_rollout

    def save(name, rewards):
        samples = [
            Sample(
                prompt="p",
                response=str(r),
                reward=float(r),
                group_index=i // 2,
                index=i,
                status=Sample.Status.COMPLETED,
            )
            for i, r in enumerate(rewards)
        ]
        torch.save({"rollout_id": 0, "samples": [s.to_dict() for s in samples]}, tmp_path / name)

    save("0.pt", [1, 0, 1, 1])
    save("eval_3.pt", [0, 1])
    args = make_args(
        n_samples_per_prompt=2, rollout_batch_size=2, load_forge_rollout_data=str(tmp_path / "{rollout_id}.pt")
    )
    assert not args.debug_train_only  # unlike --load-debug-rollout-data
    out = generate_rollout(args, 5, None)  # no 5.pt: training falls back to 0.pt
    assert isinstance(out, RolloutFnTrainOutput) and [[s.reward for s in g] for g in out.samples] == [[1, 0], [1, 1]]
    ev = generate_rollout(args, 3, None, evaluation=True)
    assert isinstance(ev, RolloutFnEvalOutput) and ev.data["forge_eval"]["rewards"] == [0, 1]
    assert generate_rollout(args, 4, None, evaluation=True).data == {}  # eval never falls back
    literal = make_args(n_samples_per_prompt=2, rollout_batch_size=2, load_forge_rollout_data=str(tmp_path / "0.pt"))
    assert len(generate_rollout(literal, 9, None).samples) == 2
    assert generate_rollout(literal, 9, None, evaluation=True).data == {}
    missing = make_args(load_forge_rollout_data=str(tmp_path / "nope.pt"))
    with pytest.raises(SlimeError, match="--load-forge-rollout-data: no file"):
        generate_rollout(missing, 0, None)
