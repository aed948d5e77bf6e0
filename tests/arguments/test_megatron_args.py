"""Megatron-LM options in slime launch scripts: accepted with Megatron's dests and defaults, the
model-shape block checked against the checkpoint's config, everything else named as not used."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from slime.arguments import parse_args
from slime.arguments.megatron import PATCH_DATA, check_model_shape, megatron_options, unused_note
from slime.errors import SlimeError

BASE = ["--rollout-batch-size", "4", "--num-rollout", "2"]

# The shape of slime's scripts/models/qwen3-4B.sh, and the PERF/MISC blocks of its run script.
QWEN3_4B_MODEL_ARGS = [
    "--swiglu",
    "--num-layers",
    "36",
    "--hidden-size",
    "2560",
    "--ffn-hidden-size",
    "9728",
    "--num-attention-heads",
    "32",
    "--group-query-attention",
    "--num-query-groups",
    "8",
    "--use-rotary-position-embeddings",
    "--disable-bias-linear",
    "--normalization",
    "RMSNorm",
    "--norm-epsilon",
    "1e-6",
    "--rotary-base",
    "1000000",
    "--vocab-size",
    "151936",
    "--kv-channels",
    "128",
    "--qk-layernorm",
]
PERF_AND_MISC = [
    "--tensor-model-parallel-size",
    "2",
    "--sequence-parallel",
    "--pipeline-model-parallel-size",
    "1",
    "--context-parallel-size",
    "1",
    "--expert-model-parallel-size",
    "1",
    "--expert-tensor-parallel-size",
    "1",
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "uniform",
    "--recompute-num-layers",
    "1",
    "--attention-dropout",
    "0.0",
    "--hidden-dropout",
    "0.0",
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "flash",
]
# Qwen3-4B's config.json values for the same fields (written out here, independently of the code).
QWEN3_4B_CONFIG = {
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
}


def test_a_slime_model_block_parses_with_megatrons_dests():
    a = parse_args(BASE + QWEN3_4B_MODEL_ARGS + PERF_AND_MISC)
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_query_groups, a.kv_channels) == (
        36,
        2560,
        9728,
        8,
        128,
    )
    assert a.swiglu and a.qk_layernorm and a.group_query_attention and a.add_bias_linear is False
    assert a.layernorm_epsilon == 1e-6 and a.rotary_base == 1000000 and a.normalization == "RMSNorm"
    assert a.tensor_model_parallel_size == 2 and a.sequence_parallel and a.attention_backend == "flash"
    assert a.recompute_granularity == "full" and a.attention_dropout == 0.0
    # options nobody set carry Megatron's defaults, as under slime
    assert a.bf16 is False and a.num_experts is None and a.transformer_impl == "transformer_engine"
    # slime-rl's own definitions win where the names coincide
    assert a.lr == 1e-6 and a.micro_batch_size == 1


def test_unused_options_are_named_once_and_shape_options_are_not():
    a = parse_args(BASE + QWEN3_4B_MODEL_ARGS + PERF_AND_MISC)
    note = unused_note(a)
    for used in ("--num-layers", "--swiglu", "--qk-layernorm", "--norm-epsilon"):
        assert used not in note.split()
    for unused in (
        "--tensor-model-parallel-size",
        "--sequence-parallel",
        "--attention-backend",
        "--accumulate-allreduce-grads-in-fp32",
        "--use-rotary-position-embeddings",
    ):
        assert note.split().count(unused) == 1
    assert unused_note(parse_args(BASE)) is None


def test_model_shape_matches_and_mismatches_name_both_values():
    a = parse_args(BASE + QWEN3_4B_MODEL_ARGS)
    check_model_shape(a, QWEN3_4B_CONFIG, "/models/Qwen3-4B/config.json")
    for option, value, key, have in [
        ("--num-layers", "28", "num_hidden_layers", 36),
        ("--hidden-size", "4096", "hidden_size", 2560),
        ("--num-query-groups", "4", "num_key_value_heads", 8),
        ("--kv-channels", "64", "head_dim", 128),
        ("--rotary-base", "10000", "rope_theta", 1000000),
        ("--norm-epsilon", "1e-05", "rms_norm_eps", 1e-06),
        ("--vocab-size", "152064", "vocab_size", 151936),
    ]:
        wrong = parse_args(BASE + QWEN3_4B_MODEL_ARGS + [option, value])
        with pytest.raises(
            SlimeError,
            match=rf"^{option} {value} does not match the model: "
            rf"/models/Qwen3-4B/config.json has {key} = {have}",
        ):
            check_model_shape(wrong, QWEN3_4B_CONFIG, "/models/Qwen3-4B/config.json")


def test_multimodal_and_moe_configs_are_judged_as_slime_does():
    moe = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
    }
    ok = parse_args(
        BASE
        + [
            "--num-layers",
            "48",
            "--ffn-hidden-size",
            "1",
            "--moe-ffn-hidden-size",
            "768",
            "--num-experts",
            "128",
            "--moe-router-topk",
            "8",
        ]
    )
    check_model_shape(ok, moe, "m.json")  # the dense ffn size of a MoE model is not compared
    with pytest.raises(
        SlimeError, match="--moe-router-topk 4 does not match the model: m.json has num_experts_per_tok = 8"
    ):
        check_model_shape(parse_args(BASE + ["--moe-router-topk", "4"]), moe, "m.json")
    vl = {"model_type": "qwen3_vl", "text_config": dict(QWEN3_4B_CONFIG), "vision_config": {"hidden_size": 1024}}
    check_model_shape(parse_args(BASE + QWEN3_4B_MODEL_ARGS), vl, "vl.json")
    with pytest.raises(SlimeError, match="--hidden-size 1024 does not match the model: vl.json has hidden_size = 2560"):
        check_model_shape(parse_args(BASE + ["--hidden-size", "1024"]), vl, "vl.json")


def test_model_shape_flags_against_the_config():
    llama = {
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
    }
    check_model_shape(parse_args(BASE + ["--swiglu", "--untie-embeddings-and-output-weights"]), llama, "c.json")
    for flag, needed in [
        ("--qk-layernorm", "query/key norms"),
        ("--group-query-attention", "num_key_value_heads <"),
        ("--normalization", "rms_norm_eps / layer_norm_eps"),
    ]:
        argv = [flag, "LayerNorm"] if flag == "--normalization" else [flag]
        with pytest.raises(SlimeError, match=flag) as refused:
            check_model_shape(parse_args(BASE + argv), llama, "c.json")
        assert needed in str(refused.value)  # the message says what the config lacks
    gelu = dict(llama, hidden_act="gelu")
    with pytest.raises(SlimeError, match="--swiglu is set but c.json does not have hidden_act = silu"):
        check_model_shape(parse_args(BASE + ["--swiglu"]), gelu, "c.json")
    tied = dict(llama, tie_word_embeddings=True)
    with pytest.raises(SlimeError, match="--untie-embeddings-and-output-weights"):
        check_model_shape(parse_args(BASE + ["--untie-embeddings-and-output-weights"]), tied, "c.json")
    # a model type it cannot judge is not guessed at
    check_model_shape(parse_args(BASE + ["--qk-layernorm"]), {"model_type": "something_new"}, "c.json")


def test_preflight_stops_a_wrong_model_block_before_launch(tiny_model_dir, task_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    argv = BASE + [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--rm-type",
        "math",
        "--rollout-max-response-len",
        "8",
        "--num-layers",
        str(config["num_hidden_layers"] + 1),
    ]
    from slime.preflight import preflight

    with pytest.raises(SlimeError, match=rf"--num-layers {config['num_hidden_layers'] + 1} does not match"):
        preflight(parse_args(argv))


def test_typos_still_get_did_you_mean_and_values_are_typed():
    with pytest.raises(
        SlimeError, match="unknown argument --tensor-model-paralel-size; did you mean --tensor-model-parallel-size"
    ):
        parse_args(BASE + ["--tensor-model-paralel-size", "2"])
    with pytest.raises(SlimeError, match="--num-layers: invalid int value"):
        parse_args(BASE + ["--num-layers", "many"])
    with pytest.raises(SlimeError, match="--recompute-granularity.*invalid choice"):
        parse_args(BASE + ["--recompute-granularity", "partial"])


def test_megatron_options_in_a_yaml_config(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "rollout_batch_size": 4,
                "num_rollout": 2,
                "num_layers": 2,
                "swiglu": True,
                "tensor_model_parallel_size": 2,
            }
        )
    )
    a = parse_args(["--config", str(cfg)])
    assert a.num_layers == 2 and a.swiglu and a.tensor_model_parallel_size == 2
    assert a.megatron_options_given == ["--num-layers", "--swiglu", "--tensor-model-parallel-size"]


def test_the_option_data_is_megatrons_parser():
    """The data file holds Megatron-LM's parser (written by scripts/extract_megatron_args.py)."""
    opts = megatron_options()
    assert len(opts) > 600
    assert opts["--norm-epsilon"]["dest"] == "layernorm_epsilon"
    assert opts["--disable-bias-linear"] == {
        **opts["--disable-bias-linear"],
        "dest": "add_bias_linear",
        "action": "_StoreFalseAction",
        "default": True,
    }
    assert opts["--recompute-granularity"]["choices"] == ["full", "selective"]


ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path("/work/.mirror/THUDM+slime/repo")


def test_the_options_of_slimes_megatron_patch_are_accepted_with_its_dests_and_defaults():
    """slime's patched Megatron-LM adds flags its model blocks pass (Qwen3-Next/Qwen3.5, GLM4)."""
    opts = megatron_options()
    for name, dest in [
        ("--use-gated-attention", "use_gated_attention"),
        ("--post-self-attn-layernorm", "post_self_attn_layernorm"),
        ("--post-mlp-layernorm", "post_mlp_layernorm"),
    ]:
        assert opts[name] == {**opts[name], "dest": dest, "action": "_StoreTrueAction", "default": False}
        assert opts[name]["patches"]  # the slime patch files that add it
    assert "docker/patch/latest/megatron.patch" in opts["--use-gated-attention"]["patches"]
    a = parse_args(BASE)
    assert (a.use_gated_attention, a.post_self_attn_layernorm, a.post_mlp_layernorm) == (False, False, False)
    a = parse_args(BASE + ["--use-gated-attention", "--post-mlp-layernorm", "--tensor-model-parallel-size", "2"])
    assert a.use_gated_attention and a.post_mlp_layernorm
    # model-shape flags (checked against config.json), so not in the "not used" line
    assert (
        unused_note(a) == "Megatron-LM options accepted but not used by the fsdp backend: --tensor-model-parallel-size"
    )


def _run_extractor(slime_root: Path, out: Path, commit: str = "0" * 40) -> dict:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/extract_megatron_args.py"), "--slime-patches", str(slime_root)]
        + ["--commit", commit, str(out)],
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())


def test_the_patch_extractor_reads_add_argument_calls_a_patch_adds(tmp_path):
    """Only added lines of a Megatron arguments.py count; a call spanning lines is read whole."""
    patch = tmp_path / "docker/patch/v1/megatron.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text(
        textwrap.dedent(
            """\
            diff --git a/megatron/training/arguments.py b/megatron/training/arguments.py
            --- a/megatron/training/arguments.py
            +++ b/megatron/training/arguments.py
            @@ -1,3 +1,6 @@ def _add_network_size_args(parser):
                 group.add_argument('--old-flag', action='store_true')
            +    group.add_argument('--new-width', type=int, default=7,
            +                       help='A width.')
            +    group.add_argument('--new-flag', action='store_true', dest='flag_dest')
            -    group.add_argument('--removed', action='store_true')
            diff --git a/megatron/core/other.py b/megatron/core/other.py
            +++ b/megatron/core/other.py
            +    parser.add_argument('--not-megatrons-parser')
            """
        )
    )
    data = _run_extractor(tmp_path, tmp_path / "out.json")
    assert set(data["options"]) == {"--new-width", "--new-flag"}
    width = data["options"]["--new-width"]
    assert (width["dest"], width["type"], width["default"], width["nargs"]) == ("new_width", "int", 7, None)
    assert data["options"]["--new-flag"]["dest"] == "flag_dest"
    assert data["options"]["--new-flag"]["patches"] == ["docker/patch/v1/megatron.patch"]


def test_the_patch_extractor_reproduces_the_shipped_data(tmp_path):
    """scripts/extract_megatron_args.py --slime-patches on slime's docker/ at the recorded commit
    writes the shipped file (skipped where the slime mirror is not on this machine)."""
    shipped = json.loads(PATCH_DATA.read_text())
    commit = shipped["source"]["commit"]
    if not MIRROR.exists():
        pytest.skip("no local mirror of THUDM/slime")
    try:
        tar = subprocess.run(["git", "-C", str(MIRROR), "archive", commit, "docker"], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        pytest.skip(f"the mirror does not hold commit {commit}")
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=tar.stdout, check=True)
    assert _run_extractor(tmp_path, tmp_path / "out.json", commit) == shipped


@pytest.mark.parametrize("flag, dtype", [(None, torch.float32), ("--bf16", torch.bfloat16), ("--fp16", torch.float16)])
def test_bf16_fp16_are_mixed_precision_training(tiny_model_dir, tmp_path, flag, dtype):
    """Megatron's --bf16 / --fp16 on this backend: the train step's forward computes in that dtype
    (seen at the output head) while the parameters stay fp32 master weights that the step updates."""
    from slime.backends.torch.actor import TrainActor

    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--num-rollout",
        "1",
        "--micro-batch-size",
        "4",
        "--lr",
        "1e-2",
        "--run-dir",
        str(tmp_path),
    ]
    args = parse_args(argv + ([flag] if flag else []))
    assert flag is None or flag in args.megatron_options_given and unused_note(args) is None  # mapped, not "unused"
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    seen = []
    actor.model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    before = actor.model.lm_head.weight.detach().clone()
    data = {
        "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17]],
        "response_lengths": [2, 2, 2, 2],
        "loss_masks": [[1, 1]] * 4,
        "rewards": [1.0, -1.0, 0.5, -0.5],
    }
    metrics = actor.train(0, data)
    assert seen and set(seen) == {dtype}
    assert all(p.dtype == torch.float32 for p in actor.model.parameters())
    assert math.isfinite(metrics["train/pg_loss"]) and not torch.equal(before, actor.model.lm_head.weight)


def test_bf16_and_fp16_together_stop():
    with pytest.raises(SlimeError, match="--bf16 and --fp16"):
        parse_args(BASE + ["--bf16", "--fp16"])


def test_the_megatron_backend_reads_its_parallel_layout():
    """Tensor-parallel groups are data-parallel ranks with --train-backend megatron (Megatron's
    rule); the fsdp backend shards over every rank and names the option as not used."""
    tp2 = ["--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "2", "--global-batch-size", "2"]
    a = parse_args(BASE + tp2 + ["--train-backend", "megatron"])
    assert (a.actor_world_size, a.data_parallel_size) == (4, 2)
    assert unused_note(a) is None
    a = parse_args(BASE + tp2[:4] + ["--global-batch-size", "4"])
    assert a.data_parallel_size == 4 and "--tensor-model-parallel-size" in unused_note(a)
    with pytest.raises(SlimeError, match=r"--tensor-model-parallel-size 3 must divide the training ranks \(4"):
        parse_args(BASE + tp2[:2] + ["--tensor-model-parallel-size", "3", "--train-backend", "megatron"])
    with pytest.raises(SlimeError, match=r"data-parallel size \(2: .*--tensor-model-parallel-size"):
        parse_args(BASE + tp2[:4] + ["--micro-batch-size", "4", "--train-backend", "megatron"])
