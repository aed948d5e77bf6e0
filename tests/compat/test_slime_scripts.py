"""slime-style launch scripts come over unchanged: they parse, name what this backend does not
use, and stop only where this machine differs (a checkpoint that is not here); a model-config
block written for another model stops before launch naming both values."""

from __future__ import annotations

import json

import pytest

from slime.arguments import parse_args, startup_notes
from slime.errors import SlimeError
from slime.preflight import preflight
from slime.train import main
from tests.compat.slime_scripts import CKPT, SCRIPTS, TINY_MODEL, with_paths


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_slime_script_parses_and_stops_only_at_the_missing_checkpoint(name):
    args = parse_args(SCRIPTS[name])
    assert args.balance_data and args.use_dynamic_batch_size and args.recompute_granularity == "full"
    assert args.actor_world_size == 8 and args.num_engines == 8 // args.rollout_num_gpus_per_engine
    notes = "\n".join(startup_notes(args))
    for unused in ("--tensor-model-parallel-size", "--sequence-parallel", "--attention-backend"):
        assert unused in notes  # named, never dropped silently
    with pytest.raises(SlimeError, match="--hf-checkpoint /root/"):
        preflight(args)


def test_moe_script_keeps_sglang_and_router_options():
    args = parse_args(SCRIPTS["qwen3-30b-a3b"])
    notes = "\n".join(startup_notes(args))
    assert "--sglang-enable-dp-attention" in notes and "--sglang-cuda-graph-bs 1 2 4 8" in notes
    assert args.router_args == ["--balance-abs-threshold", "0"]
    assert args.num_experts == 128 and args.moe_router_topk == 8


def test_a_model_block_for_another_model_stops_naming_both_values(tiny_model_dir, task_dir):
    argv = with_paths(SCRIPTS["qwen3-4b"], hf_checkpoint=str(tiny_model_dir), prompt_data=str(task_dir / "train.jsonl"))
    with pytest.raises(SlimeError) as e:
        preflight(parse_args(argv))
    assert "--num-layers 36" in str(e.value) and "num_hidden_layers = 2" in str(e.value)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_bundled_task_trains_from_a_slime_style_launch(ray_cluster, tiny_model_dir, task_dir, tmp_path, capsys):
    """The same groups, the tiny model's own block, local paths and CPU-sized numbers: it runs and
    its metrics rows are finite; --load of an empty directory starts fresh from --ref-load."""
    ckpt = tmp_path / "ckpt"
    argv = (
        TINY_MODEL
        + with_paths(
            CKPT,
            hf_checkpoint=str(tiny_model_dir),
            ref_load=str(tiny_model_dir),
            load=str(ckpt),
            save=str(ckpt),
            save_interval="2",
        )
        + [
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rollout-shuffle",
            "--rm-type",
            "math",
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "8",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "8",
            "--rollout-temperature",
            "1",
            "--global-batch-size",
            "32",
            "--balance-data",
            "--eval-interval",
            "2",
            "--eval-prompt-data",
            "add",
            str(task_dir / "eval.jsonl"),
            "--eval-max-response-len",
            "8",
            "--tensor-model-parallel-size",
            "1",
            "--sequence-parallel",
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
            "--use-dynamic-batch-size",
            "--max-tokens-per-gpu",
            "4096",
            "--advantage-estimator",
            "grpo",
            "--use-kl-loss",
            "--kl-loss-coef",
            "0.00",
            "--kl-loss-type",
            "low_var_kl",
            "--entropy-coef",
            "0.00",
            "--eps-clip",
            "0.2",
            "--eps-clip-high",
            "0.28",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--lr-decay-style",
            "constant",
            "--weight-decay",
            "0.1",
            "--adam-beta1",
            "0.9",
            "--adam-beta2",
            "0.98",
            "--rollout-num-gpus-per-engine",
            "1",
            "--sglang-cuda-graph-bs",
            "1",
            "2",
            "--attention-dropout",
            "0.0",
            "--hidden-dropout",
            "0.0",
            "--accumulate-allreduce-grads-in-fp32",
            "--attention-softmax-in-fp32",
            "--attention-backend",
            "flash",
            "--actor-num-nodes",
            "1",
            "--actor-num-gpus-per-node",
            "1",
            "--colocate",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert main(argv) == 0  # `slime train`'s own entry point, in the session's shared Ray cluster
    out = capsys.readouterr().out
    assert "holds no checkpoint yet: starting at rollout 0 from --ref-load" in out
    assert "Megatron-LM options accepted but not used" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/pg_loss" in r]
    assert len(train_rows) == 2
    assert all(r["train/pg_loss"] == r["train/pg_loss"] for r in train_rows)  # finite, not NaN
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_hooks_written_for_slime_run_unchanged(ray_cluster, tiny_model_dir, task_dir, tmp_path):
    """A custom generate (GenerateState + post + the router URL from args), a dynamic filter built on
    call_dynamic_filter and a convert hook fn(args, samples), imported by slime's paths, in a short run."""
    run_dir = tmp_path / "run"
    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rm-type",
        "math",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--over-sampling-batch-size",
        "4",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "16",
        "--lr",
        "1e-3",
        "--colocate",
        "--run-dir",
        str(run_dir),
        "--custom-generate-function-path",
        "tests.compat.slime_hooks.generate",
        "--dynamic-sampling-filter-path",
        "tests.compat.slime_hooks.dynamic_filter",
        "--custom-convert-samples-to-train-data-path",
        "tests.compat.slime_hooks.convert_samples_to_train_data",
    ]
    assert main(argv) == 0
    calls = [json.loads(line) for line in (run_dir / "hook_calls.jsonl").read_text().splitlines()]
    kinds = {c["hook"] for c in calls}
    assert kinds == {"generate", "filter", "convert"}, kinds
    assert sum(c["hook"] == "convert" for c in calls) == 2
    assert all(c["n"] == 16 for c in calls if c["hook"] == "convert")
    masks = [(c["assistant_mask_tokens"], c["total"]) for c in calls if c["hook"] == "generate"]
    assert all(0 < n < total for n, total in masks)  # the assistant turn only, never the prompt
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "train/pg_loss" in r]) == 2
    assert all(r["rollout/status/failed"] == 0 for r in rows if "rollout/status/failed" in r)
