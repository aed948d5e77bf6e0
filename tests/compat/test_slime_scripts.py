"""slime-style launch scripts come over unchanged: they parse, name what this backend does not
use, and stop only where this machine differs (a checkpoint that is not here); a model-config
block written for another model stops before launch naming both values."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slime.arguments import parse_args, startup_notes
from slime.arguments.megatron import check_model_shape
from slime.errors import SlimeError
from slime.preflight import preflight
from slime.train import main
from tests.compat.slime_scripts import CKPT, SCRIPTS, TINY_MODEL, with_paths

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/THUDM+slime/repo")

# The config.json fields of the models those blocks describe (Qwen3-Next-80B-A3B-Instruct,
# GLM-4-9B-0414), written out here: only what the model-block check reads.
QWEN3_NEXT_CONFIG = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "vocab_size": 151936,
    "rope_theta": 10000000,
    "rms_norm_eps": 1e-6,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
GLM4_9B_CONFIG = {
    "model_type": "glm4",
    "num_hidden_layers": 40,
    "hidden_size": 4096,
    "intermediate_size": 13696,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 151552,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-5,
    "attention_bias": True,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


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


def test_every_launch_script_of_slime_parses():
    """scripts/check_slime_scripts.py over the slime mirror: every launch script's command line, as
    bash builds it, parses (skipped where the mirror is not on this machine)."""
    if not MIRROR.exists():
        pytest.skip(f"no local mirror of THUDM/slime at {MIRROR}")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/check_slime_scripts.py"), str(MIRROR)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = re.search(r"^(\d+) of (\d+) slime launch scripts parse", run.stdout, re.M)
    assert summary, run.stdout + run.stderr
    failures = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert run.returncode == 0 and not failures, "\n".join(failures) or run.stderr
    assert summary[1] == summary[2] and int(summary[2]) >= 40  # every script found, each parses
    for script in ("scripts/run-qwen3-next-80B-A3B.sh", "scripts/run-glm4-9B.sh", "scripts/run-qwen3-4B.sh"):
        assert f"ok    {script}" in run.stdout


def test_gated_attention_is_checked_against_the_model():
    args = parse_args(SCRIPTS["qwen3-next-80b-a3b"])
    assert args.use_gated_attention and args.attention_output_gate
    check_model_shape(args, QWEN3_NEXT_CONFIG, "Qwen3-Next/config.json")
    qwen35 = {"text_config": dict(QWEN3_NEXT_CONFIG, model_type="qwen3_5_moe_text")}  # a VLM's text part
    check_model_shape(args, qwen35, "Qwen3.5/config.json")
    for other in (dict(QWEN3_NEXT_CONFIG, model_type="qwen3_moe"), dict(QWEN3_NEXT_CONFIG, attn_output_gate=False)):
        with pytest.raises(SlimeError, match="--use-gated-attention is set but q.json does not have gated attention"):
            check_model_shape(args, other, "q.json")
    notes = "\n".join(startup_notes(args))
    assert "--use-gated-attention" not in notes and "--attention-output-gate" not in notes  # checked, so used
    assert "--moe-shared-expert-gate" in notes  # the rest of the block: named as not used


def test_glm4_post_norms_are_checked_against_the_model():
    args = parse_args(SCRIPTS["glm4-9b"])
    assert args.post_self_attn_layernorm and args.post_mlp_layernorm and args.add_qkv_bias
    check_model_shape(args, GLM4_9B_CONFIG, "GLM-4-9B/config.json")
    with pytest.raises(SlimeError, match="--post-self-attn-layernorm is set but g.json does not have a norm after"):
        check_model_shape(args, dict(GLM4_9B_CONFIG, model_type="glm4_moe"), "g.json")
    unset = parse_args([a for a in SCRIPTS["glm4-9b"] if not a.startswith("--post-")])
    assert unset.post_self_attn_layernorm is False and unset.post_mlp_layernorm is False  # the patch's defaults
    check_model_shape(unset, dict(GLM4_9B_CONFIG, model_type="glm4_moe"), "g.json")
    assert "--post-mlp-layernorm" not in "\n".join(startup_notes(args))


def test_a_post_norm_block_for_another_glm_stops_before_launch(tmp_path):
    """Through the start-up checks: a tiny model directory whose config is a GLM-4 MoE model."""
    model = tmp_path / "GLM-4.5-Air"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(dict(GLM4_9B_CONFIG, model_type="glm4_moe")))
    (model / "model.safetensors").write_bytes(b"")
    argv = with_paths(SCRIPTS["glm4-9b"], hf_checkpoint=str(model)) + ["--run-dir", str(tmp_path / "run")]
    with pytest.raises(SlimeError, match="--post-self-attn-layernorm is set but .*GLM-4.5-Air/config.json"):
        preflight(parse_args(argv))


def test_an_option_of_slimes_sglang_patch_is_accepted_and_named():
    """--sglang-custom-pull-weights-pre-read-hook exists only in slime's SGLang patch (delta weight
    sync): accepted, and with the built-in engine named at start-up as not used by it."""
    args = parse_args(
        SCRIPTS["qwen3-4b"]
        + ["--rollout-backend", "builtin", "--sglang-custom-pull-weights-pre-read-hook", "my_hooks.refresh_mount"]
    )
    notes = "\n".join(startup_notes(args))
    assert "--sglang-custom-pull-weights-pre-read-hook my_hooks.refresh_mount" in notes
    with pytest.raises(SlimeError, match="unknown engine argument --sglang-custom-pull-weights-pre-read-hok"):
        parse_args(
            SCRIPTS["qwen3-4b"] + ["--rollout-backend", "builtin", "--sglang-custom-pull-weights-pre-read-hok", "x"]
        )


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_the_bundled_task_trains_from_a_slime_style_launch(
    ray_cluster, tiny_model_dir, task_dir, tmp_path, capsys, backend
):
    """The same groups, the tiny model's own block, local paths and CPU-sized numbers: it runs and
    its metrics rows are finite; --load of an empty directory starts fresh from --ref-load. On the
    megatron backend with the parallel block of slime's qwen3-4B script: 2 tensor-parallel ranks,
    sequence parallelism, every layer recomputed, packed micro-batches, colocated with one engine."""
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
    if backend == "megatron":
        two = {"tensor_model_parallel_size": "2", "actor_num_gpus_per_node": "2", "rollout_num_gpus_per_engine": "2"}
        argv = with_paths(argv, **two) + ["--train-backend", "megatron"]
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


# ------------------------------------------------------------------ slime's SGLang patches as data
def _update_sglang_data(slime_root: Path, out: Path, commit: str) -> dict:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/extract_sglang_args.py"), "--slime", str(slime_root)]
        + ["--slime-commit", commit, "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())


def test_the_sglang_extractor_adds_what_a_slime_patch_adds(tmp_path):
    """Fields and add_argument calls on the + side of a server_args.py hunk; an option SGLang's own
    file already has is not added twice; a re-run replaces the patch options, not SGLang's."""
    out = tmp_path / "sglang.json"
    own = {"dest": "tp_size", "nargs": None, "flag": False, "aliases": [], "action": "store", "origin": "field"}
    out.write_text(
        json.dumps({"source": {}, "count": 1, "options": {"--tp-size": own}, "aliases": {}, "undetermined": []})
    )
    patch = tmp_path / "docker/patch/latest/sglang-x.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text(
        "diff --git a/python/sglang/srt/server_args.py b/python/sglang/srt/server_args.py\n"
        "+++ b/python/sglang/srt/server_args.py\n"
        "@@ -1,3 +1,9 @@ class ServerArgs:\n"
        "+    pre_read_hook: A[\n"
        "+        Optional[str],\n"
        '+        "Import path of a hook.",\n'
        "+    ] = None\n"
        '+    tp_size: A[int, "again"] = 1\n'
        "     weight_loader_disable_mmap: A[bool, 'x'] = False\n"
        '+        parser.add_argument("--new-flag", action="store_true")\n'
    )
    data = _update_sglang_data(tmp_path, out, "1" * 40)
    assert set(data["options"]) == {"--tp-size", "--pre-read-hook", "--new-flag"} and data["count"] == 3
    assert data["options"]["--tp-size"] == own
    hook, flag = data["options"]["--pre-read-hook"], data["options"]["--new-flag"]
    assert (hook["nargs"], hook["flag"], hook["patches"]) == (None, False, ["docker/patch/latest/sglang-x.patch"])
    assert (flag["nargs"], flag["flag"], flag["origin"]) == (0, True, "add_argument")
    assert data["source"]["slime_patches"]["commit"] == "1" * 40
    patch.unlink()
    assert set(_update_sglang_data(tmp_path, out, "2" * 40)["options"]) == {"--tp-size"}


def test_the_sglang_data_holds_slimes_patches_as_the_extractor_reads_them(tmp_path):
    """The shipped SGLang data, updated from slime's docker/ at the commit it names, is unchanged
    (skipped where the slime mirror is not on this machine)."""
    shipped_path = ROOT / "slime/arguments/sglang_server_args.json"
    shipped = json.loads(shipped_path.read_text())
    assert shipped["options"]["--custom-pull-weights-pre-read-hook"]["nargs"] is None
    commit = shipped["source"]["slime_patches"]["commit"]
    if not MIRROR.exists():
        pytest.skip("no local mirror of THUDM/slime")
    try:
        tar = subprocess.run(["git", "-C", str(MIRROR), "archive", commit, "docker"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        pytest.skip(f"the mirror does not hold commit {commit}")
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=tar.stdout, check=True)
    out = tmp_path / "out.json"
    out.write_text(shipped_path.read_text())
    assert _update_sglang_data(tmp_path, out, commit) == shipped
