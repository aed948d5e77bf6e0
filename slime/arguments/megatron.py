"""Megatron-LM's options, accepted as slime accepts them: a slime launch script carries ~30 of them
(model shape, parallelism, precision, recompute, optimizer) and must parse unchanged here.

The option set is data (`megatron_lm.json`: every option of Megatron-LM's parser at the commit
slime pins; `megatron_slime_patch.json`: the options slime's patches to Megatron-LM add, such as
`--use-gated-attention` and GLM4's `--post-self-attn-layernorm`; both written by
`scripts/extract_megatron_args.py`), so a typo still gets "did you mean" and `args` carries
Megatron's dests and defaults as it does under slime. Options slime-rl defines
itself (`--lr`, `--seed`, `--micro-batch-size`, ...) keep slime-rl's definition. Of the rest:

* model-shape options are checked against `--hf-checkpoint`'s config.json before launch
  (`check_model_shape`, from the start-up checks): a script written for another model stops,
  naming the option, its value and the config's;
* `--recompute-*` turn on gradient checkpointing in the trainer (`MAPPED`);
* every other one the command line sets is accepted and named once at start-up as not used by
  this backend (`unused_note`): nothing a user wrote is dropped silently.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.arguments.from_data import add_options
from slime.errors import SlimeError

DATA = Path(__file__).with_name("megatron_lm.json")
PATCH_DATA = Path(__file__).with_name("megatron_slime_patch.json")
GROUP_TITLE = "Megatron-LM (accepted; model shape checked against --hf-checkpoint, the rest not used by fsdp)"


@lru_cache(maxsize=1)
def megatron_options() -> dict[str, dict[str, Any]]:
    """Option name -> {aliases, dest, action, nargs, type, default, const, choices}: Megatron-LM's
    parser as slime patches it (the patch's options also name the patch files adding them)."""
    return {**json.loads(DATA.read_text()), **json.loads(PATCH_DATA.read_text())["options"]}


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


_TYPES: dict[str | None, Callable[[str], Any]] = {"int": int, "float": float, "bool": _bool}


def add_arguments(p: argparse.ArgumentParser) -> set[str]:
    """Every Megatron-LM option slime-rl does not define itself (call after the other groups);
    returns the option strings added. Megatron's own converters (enum and tuple parsers) are not
    here: their values stay strings."""
    known = {s for a in p._actions for s in a.option_strings}
    return add_options(p.add_argument_group(GROUP_TITLE), megatron_options(), known, _TYPES)


# ------------------------------------------------------------------------------ model shape
def _rope_theta(cfg: dict) -> Any:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return cfg.get("rope_theta", params.get("rope_theta") if isinstance(params, dict) else None)


def _head_dim(cfg: dict) -> Any:
    if cfg.get("head_dim"):
        return cfg["head_dim"]
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return cfg["hidden_size"] // cfg["num_attention_heads"]
    return None


def _first(*keys: str) -> Callable[[dict], Any]:
    def get(cfg: dict) -> Any:
        return next((cfg[k] for k in keys if cfg.get(k) is not None), None)

    return get


def _norm_type(cfg: dict) -> Any:
    if "rms_norm_eps" in cfg:
        return "RMSNorm"
    if "layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg:
        return "LayerNorm"
    return None


# option -> (args dest, what config.json says, its name there). Only options the command line sets
# are checked, and only where the config has the value.
SHAPE: dict[str, tuple[str, Callable[[dict], Any], str]] = {
    "--num-layers": ("num_layers", _first("num_hidden_layers", "n_layer"), "num_hidden_layers"),
    "--hidden-size": ("hidden_size", _first("hidden_size", "n_embd"), "hidden_size"),
    "--ffn-hidden-size": ("ffn_hidden_size", _first("intermediate_size"), "intermediate_size"),
    "--num-attention-heads": ("num_attention_heads", _first("num_attention_heads", "n_head"), "num_attention_heads"),
    "--num-query-groups": ("num_query_groups", _first("num_key_value_heads"), "num_key_value_heads"),
    "--kv-channels": ("kv_channels", _head_dim, "head_dim"),
    "--vocab-size": ("vocab_size", _first("vocab_size"), "vocab_size"),
    "--max-position-embeddings": (
        "max_position_embeddings",
        _first("max_position_embeddings"),
        "max_position_embeddings",
    ),
    "--rotary-base": ("rotary_base", _rope_theta, "rope_theta"),
    "--norm-epsilon": (
        "layernorm_epsilon",
        _first("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
        "rms_norm_eps",
    ),
    "--normalization": ("normalization", _norm_type, "rms_norm_eps / layer_norm_eps"),
    "--num-experts": ("num_experts", _first("num_experts", "num_local_experts", "n_routed_experts"), "num_experts"),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", _first("moe_intermediate_size"), "moe_intermediate_size"),
    "--moe-router-topk": ("moe_router_topk", _first("num_experts_per_tok"), "num_experts_per_tok"),
    "--moe-shared-expert-intermediate-size": (
        "moe_shared_expert_intermediate_size",
        _first("shared_expert_intermediate_size"),
        "shared_expert_intermediate_size",
    ),
}
# Flags: option -> (args dest, does the config agree: True / False / None when it cannot tell, what it needs).
QK_NORM_TYPES = {
    "qwen3": True,
    "qwen3_moe": True,
    "qwen3_next": True,
    "olmo2": True,
    "olmoe": True,
    "llama": False,
    "qwen2": False,
    "qwen2_moe": False,
    "mistral": False,
    "mixtral": False,
}
QKV_BIAS_TYPES = {"qwen2": True, "qwen2_moe": True, "qwen3": False, "qwen3_moe": False, "mistral": False}
# An output gate on attention (Qwen3-Next's and Qwen3.5's query projection also yields the gate).
GATED_ATTENTION_TYPES = {
    "qwen3_next": True,
    "qwen3_5": True,
    "qwen3_5_text": True,
    "qwen3_5_moe": True,
    "qwen3_5_moe_text": True,
    "qwen3": False,
    "qwen3_moe": False,
    "qwen2": False,
    "qwen2_moe": False,
    "llama": False,
    "mistral": False,
    "mixtral": False,
}
# A norm on the attention and MLP outputs before the residual add (GLM-4's decoder layer, which
# GLM-4's MoE successors dropped).
POST_NORM_TYPES = {
    "glm4": True,
    "glm4_moe": False,
    "glm4_moe_lite": False,
    "glm": False,
    "llama": False,
    "qwen2": False,
    "qwen3": False,
    "qwen3_moe": False,
    "mistral": False,
}


def _gated_attention(cfg: dict) -> bool | None:
    if isinstance(cfg.get("attn_output_gate"), bool):
        return cfg["attn_output_gate"]
    return GATED_ATTENTION_TYPES.get(cfg.get("model_type"))


def _gqa(cfg: dict) -> bool | None:
    heads = cfg.get("num_attention_heads")
    return None if heads is None else cfg.get("num_key_value_heads", heads) < heads


FLAGS: dict[str, tuple[str, Callable[[dict], bool | None], str]] = {
    "--swiglu": (
        "swiglu",
        lambda c: c["hidden_act"] in ("silu", "swish") if "hidden_act" in c else None,
        "hidden_act = silu (a gated SiLU MLP)",
    ),
    "--untie-embeddings-and-output-weights": (
        "untie_embeddings_and_output_weights",
        lambda c: c.get("tie_word_embeddings", True) is False,
        "tie_word_embeddings = false",
    ),
    "--group-query-attention": ("group_query_attention", _gqa, "num_key_value_heads < num_attention_heads"),
    "--qk-layernorm": (
        "qk_layernorm",
        lambda c: QK_NORM_TYPES.get(c.get("model_type")),
        "a model type with query/key norms (qwen3, olmo2, ...)",
    ),
    "--add-qkv-bias": (
        "add_qkv_bias",
        lambda c: c["attention_bias"] if "attention_bias" in c else QKV_BIAS_TYPES.get(c.get("model_type")),
        "biases on the query/key/value projections (attention_bias, or a qwen2 model)",
    ),
    # slime's Megatron patch's name for Megatron's --attention-output-gate (Qwen3-Next's blocks pass both)
    "--use-gated-attention": (
        "use_gated_attention",
        _gated_attention,
        "gated attention (attn_output_gate, or a qwen3_next / qwen3_5 model)",
    ),
    "--attention-output-gate": (
        "attention_output_gate",
        _gated_attention,
        "gated attention (attn_output_gate, or a qwen3_next / qwen3_5 model)",
    ),
    "--post-self-attn-layernorm": (
        "post_self_attn_layernorm",
        lambda c: POST_NORM_TYPES.get(c.get("model_type")),
        "a norm after self-attention (a glm4 model)",
    ),
    "--post-mlp-layernorm": (
        "post_mlp_layernorm",
        lambda c: POST_NORM_TYPES.get(c.get("model_type")),
        "a norm after the MLP (a glm4 model)",
    ),
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6)
        except (TypeError, ValueError):
            return False
    return a == b


MOE_KEYS = ("moe_intermediate_size", "num_experts", "n_routed_experts", "num_local_experts")


def check_model_shape(args: argparse.Namespace, config: dict, config_path: str) -> None:
    """Stop when a Megatron model-shape option the user set contradicts the checkpoint's config.

    As slime's own check: a multimodal config is judged by its `text_config`, and a MoE model's
    dense `intermediate_size` is not compared (its MLPs are the experts')."""
    config = config.get("text_config") or config
    given = set(args.megatron_options_given)
    if any(k in config for k in MOE_KEYS):
        given.discard("--ffn-hidden-size")
    for option, (dest, read, key) in SHAPE.items():
        if option not in given:
            continue
        want, have = getattr(args, dest), read(config)
        if have is not None and not _same(want, have):
            raise SlimeError(
                f"{option} {want} does not match the model: {config_path} has {key} = {have} "
                f"(a model-config block written for another model?)"
            )
    for option, (dest, holds, needed) in FLAGS.items():
        if option in given and getattr(args, dest) and holds(config) is False:
            raise SlimeError(f"{option} is set but {config_path} does not have {needed}")


# Options with a meaning on this backend (read where they apply).
MAPPED = {
    "--recompute-granularity": "gradient checkpointing of every decoder layer (the trainer)",
    "--recompute-method": "with --recompute-granularity: every layer is recomputed",
    "--recompute-num-layers": "with --recompute-granularity: every layer is recomputed",
    "--optimizer-cpu-offload": "the optimizer state already lives in host memory here",
    "--bf16": "mixed precision: the training forward/backward in bfloat16 (torch autocast), fp32 master weights",
    "--fp16": "mixed precision: the training forward/backward in float16 (torch autocast), fp32 master weights",
    "--distributed-timeout-minutes": "the trainer's gloo process group timeout (slime's default 10)",
}


# What --train-backend megatron reads besides (the parallel layout; options it cannot serve yet stop
# the run in slime.backends.megatron_utils.actor.check_run, naming them).
MEGATRON_BACKEND = {
    "--tensor-model-parallel-size": "tensor-parallel groups of the training ranks",
    "--pipeline-model-parallel-size": "pipeline stages (1 only, yet)",
    "--context-parallel-size": "context-parallel groups (1 only, yet)",
    "--sequence-parallel": "activations between the layers split along the sequence over the tensor-parallel ranks",
    "--use-distributed-optimizer": "the optimizer state sharded over the data-parallel ranks",
    "--lr-warmup-init": "the learning rate warm-up starts from (Megatron's OptimizerParamScheduler)",
}


def unused_note(args: argparse.Namespace) -> str | None:
    """One line naming the Megatron-LM options the command line set that this backend does not use."""
    checked = set(SHAPE) | set(FLAGS) | set(MAPPED)
    if args.train_backend == "megatron":
        checked |= set(MEGATRON_BACKEND)
    unused = [o for o in args.megatron_options_given if o not in checked]
    if not unused:
        return None
    return f"Megatron-LM options accepted but not used by the {args.train_backend} backend: {' '.join(unused)}"
