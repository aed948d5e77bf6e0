"""LoRA on the policy (`--enable-lora` / `--lora-rank`): peft's LoRA layers injected into the
Hugging Face model itself, so it stays the transformers class the trainer knows (its forward
options, its decoder layers for FSDP2, `save_pretrained`). Only the adapter's A and B train.

What leaves the trainer is always a plain model: `merged` turns the trainer's tensors
(`x.base_layer.weight`, `x.lora_A.default.weight`, ...) into `x.weight = W0 + (alpha/r)·B·A`
under the model's own names, for the engines, the old actor, `--save-hf` and the checkpoint's HF
files; the adapter itself is saved beside in PEFT's format (`save_adapter`), which
`PeftModel.from_pretrained` loads. The reference is `ReferenceView`: the policy with its adapter
switched off for the forward, the base model without a second copy of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from slime.errors import SlimeError
from slime.utils.lora_merge import merge_weight, one_thread

logger = logging.getLogger(__name__)

ADAPTER = "default"  # peft's adapter name inside the modules (dropped in PEFT's saved files)
PEFT_PREFIX = "base_model.model."  # what PEFT's saved keys start with (a PeftModel's path to the model)
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"


def target_modules(model: torch.nn.Module, targets: list[str], exclude: list[str]) -> list[str]:
    """The last names (q_proj, ...) of the decoder's linear layers that get an adapter. `all-linear`:
    every linear layer inside the decoder layers (not the output layer). A name that matches none
    stops the run, naming the model's linear layers."""
    linear = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.model.layers.named_modules()
            if isinstance(m, torch.nn.Linear) and name
        }
    )
    wanted = linear if targets == ["all-linear"] else targets
    unknown = [n for n in [*wanted, *exclude] if n not in linear]
    if unknown:
        raise SlimeError(
            f"--lora-target-modules / --exclude-modules: {', '.join(unknown)} match no linear layer of the "
            f"model's decoder layers; its linear layers are {', '.join(linear)}"
        )
    chosen = [n for n in wanted if n not in exclude]
    if not chosen:
        raise SlimeError(f"--exclude-modules {' '.join(exclude)} leaves no module for LoRA")
    return chosen


def apply(model: torch.nn.Module, args: Namespace) -> None:
    """Inject the adapter (B = 0: the policy starts as the base model), or load --lora-adapter-path's;
    then only the adapter trains."""
    from peft import LoraConfig, inject_adapter_in_model

    names = target_modules(model, args.lora_target_modules, args.lora_exclude_modules)
    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=names,
        bias="none",
    )
    # A's random start from --seed alone: every rank must hold the same adapter (ranks seed their own
    # RNG with seed + rank, and FSDP2 keeps each rank's shard of the copy it built)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    if args.bf16 or args.fp16:
        store_base_weights_in(model, torch.bfloat16 if args.bf16 else torch.float16)
    if args.lora_adapter_path:
        load_adapter(model, Path(args.lora_adapter_path), f"--lora-adapter-path {args.lora_adapter_path}")
    model.slime_lora_config = config  # what save_adapter writes as adapter_config.json


def store_base_weights_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The frozen base weights of the adapted layers in autocast's dtype (`--bf16` / `--fp16`):
    autocast rounds a linear layer's fp32 weight to that dtype at every matmul anyway, so the
    forward and backward are the same bits, and the largest part of a LoRA trainer's memory halves
    (they never train: no fp32 master copy is needed). The adapter stays fp32; what leaves the
    trainer merged (`merge_weight`) is fp32."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    reduced = set()
    for m in model.modules():
        if isinstance(m, BaseTunerLayer):
            w = m.get_base_layer().weight
            w.data = w.data.to(dtype)
            reduced.add(id(w))
    # The checkpoint's weights are a memory map of its file, resident as a whole while any tensor
    # still points into it: the other weights (norms, embeddings) get their own memory, so that the
    # map, and the fp32 copy of the base in it, goes (0.58 GB on the ~150M benchmark model)
    with torch.no_grad():
        for p in model.parameters():
            if id(p) not in reduced:
                p.data = p.data.clone()


def has_reduced_base(model: torch.nn.Module) -> bool:
    """Whether the adapted layers' base weights are stored below fp32 (`store_base_weights_in`)."""
    return any(
        ".base_layer." in name and p.dtype in (torch.bfloat16, torch.float16) for name, p in model.named_parameters()
    )


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "slime_lora_config")


def scaling(model: torch.nn.Module) -> float:
    config = model.slime_lora_config
    return float(config.lora_alpha) / float(config.r)


def merged(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The trainer's tensors as the plain model's: `x.weight = x.base_layer.weight + scale·B·A`
    (`merge_weight`, as an engine merges a synced adapter), `x.base_layer.bias` as `x.bias`, no
    adapter tensors."""
    with one_thread():
        return _merged(state, scale)


def _merged(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if f".lora_A.{ADAPTER}." in key or f".lora_B.{ADAPTER}." in key:
            continue
        if ".base_layer." not in key:
            out[key] = value
            continue
        prefix, leaf = key.split(".base_layer.")
        if leaf == "weight":
            a, b = state[f"{prefix}.lora_A.{ADAPTER}.weight"], state[f"{prefix}.lora_B.{ADAPTER}.weight"]
            value = merge_weight(value, a, b, scale)
        out[f"{prefix}.{leaf}"] = value
    return out


def base_view(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base tensors under the plain model's names (no arithmetic: for names and shapes)."""
    return {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}


def adapted_modules(model: torch.nn.Module) -> list[str]:
    """The plain model's names of the modules that carry an adapter (`model.layers.0.self_attn.q_proj`)."""
    suffix = f".lora_A.{ADAPTER}.weight"
    return sorted(name[: -len(suffix)] for name, _ in model.named_parameters() if name.endswith(suffix))


def engine_adapter(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under the names an engine's adapter update takes (`<module>.lora_A.weight`,
    `slime.engine.lora_weights`)."""
    return {k.replace(f".{ADAPTER}.", "."): v for k, v in state.items() if ".lora_A." in k or ".lora_B." in k}


def gather_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's full tensors under the trainer's names, without gathering the base (a collective
    over the ranks when the model is sharded: every rank must call)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            out[name] = full.detach().to("cpu").contiguous()
    return out


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (`base_model.model.<module>.lora_A.weight`)."""
    return {
        PEFT_PREFIX + k.replace(f".{ADAPTER}.", "."): v.detach().contiguous()
        for k, v in state.items()
        if f".lora_A.{ADAPTER}." in k or f".lora_B.{ADAPTER}." in k
    }


def save_adapter(model: torch.nn.Module, out: Path, state: dict[str, torch.Tensor], base: str) -> None:
    """The adapter in PEFT's format: adapter_config.json (base_model_name_or_path = `base`) and
    adapter_model.safetensors, from the trainer's full `state`."""
    out.mkdir(parents=True, exist_ok=True)
    config = model.slime_lora_config.to_dict()
    config.update(base_model_name_or_path=str(base), inference_mode=True, task_type="CAUSAL_LM")
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    save_file(adapter_tensors(state), str(out / ADAPTER_WEIGHTS))


def load_adapter(model: torch.nn.Module, path: Path, what: str) -> None:
    """An adapter directory's tensors into the model's adapter (names and shapes must be this
    model's: an adapter of another base model or rank stops, naming both)."""
    try:
        saved = load_file(str(path / ADAPTER_WEIGHTS))
    except Exception as e:
        raise SlimeError(f"{what}: cannot read {path / ADAPTER_WEIGHTS} ({type(e).__name__}: {e})") from e
    params = dict(model.named_parameters())
    mine = {PEFT_PREFIX + k.replace(f".{ADAPTER}.", "."): k for k in params if ".lora_" in k}
    problems = [f"{k} is not in this model's adapter" for k in saved if k not in mine]
    problems += [f"{k} is missing" for k in mine if k not in saved]
    problems += [
        f"{k} has shape {tuple(saved[k].shape)}, this model's {tuple(params[mine[k]].shape)}"
        for k in saved
        if k in mine and saved[k].shape != params[mine[k]].shape
    ]
    if problems:
        base = _saved_base(path)
        raise SlimeError(
            f"{what}: the adapter does not fit this model (adapter of {base}; this run's LoRA options give "
            f"{len(mine)} tensors): {'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''}"
        )
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for k, v in saved.items():
            p = params[mine[k]]
            if isinstance(p, DTensor):  # sharded: this rank's shard of the (identical) full tensor
                v = distribute_tensor(v.to(p.dtype), p.device_mesh, p.placements)
            p.copy_(v)


def _saved_base(path: Path) -> str:
    try:
        return str(json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path"))
    except (OSError, ValueError):
        return "an unknown base model"


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)
            _keep_frozen_base(m)


def _keep_frozen_base(layer: Any) -> None:
    """peft's enable_adapters(True) marks the adapter trainable again; the base stays frozen."""
    for p in layer.get_base_layer().parameters():
        p.requires_grad_(False)


class ReferenceView(torch.nn.Module):
    """The reference policy of a LoRA run: the policy's forward with its adapter off, in eval mode.
    The policy is held outside the module tree, so this adds no parameters and no copy."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.__dict__["policy"] = policy
        self.config = policy.config

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: Any = 0,
        **kwargs: Any,
    ) -> Any:
        policy = self.__dict__["policy"]
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad(), adapter_disabled(policy):
                return policy(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    logits_to_keep=logits_to_keep,
                    **kwargs,
                )
        finally:
            policy.train(was_training)
