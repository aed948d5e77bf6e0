"""LoRA: train a low-rank adapter beside the frozen base weights instead of every weight (peft).

Names as slime's LoRA work names them: `--enable-lora`, `--lora-rank`, `--lora-alpha`,
`--lora-dropout`, `--lora-target-modules` (its Megatron LoRA, defaults rank 16 and alpha 32), and
the names its FSDP LoRA and verl use: `--lora-rank 0` is off, `--target-modules` (`all-linear` or
a comma list), `--exclude-modules`, `--lora-adapter-path` (start from a PEFT adapter directory).

With LoRA the reference policy (KL) is the base model: the policy with its adapter disabled, no
second copy of the weights. The engines get the merged weights W0 + (alpha/r)·B·A.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slime.arguments.checks import need
from slime.errors import SlimeError

DEFAULT_RANK = 16  # slime's Megatron LoRA default, when --enable-lora gives no --lora-rank
ALL_LINEAR = "all-linear"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LoRA (train an adapter on the frozen base model)")
    g.add_argument(
        "--enable-lora",
        action="store_true",
        default=False,
        help=f"Train a LoRA adapter instead of every weight (rank {DEFAULT_RANK} unless --lora-rank).",
    )
    g.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="Rank r of the adapter; > 0 turns LoRA on, 0 turns it off.",
    )
    g.add_argument("--lora-alpha", type=float, default=32, help="The adapter's update is (alpha / r)·B·A.")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="Dropout on the adapter's input, in [0, 1).")
    g.add_argument(
        "--lora-target-modules",
        "--target-modules",
        dest="lora_target_modules",
        nargs="+",
        default=None,
        help=f"Module names (the last part: q_proj, ...) that get an adapter, space or comma separated; "
        f"{ALL_LINEAR!r} (the default): every linear layer of the decoder layers.",
    )
    g.add_argument(
        "--exclude-modules",
        dest="lora_exclude_modules",
        nargs="+",
        default=None,
        help="Module names left without an adapter (taken out of --lora-target-modules).",
    )
    g.add_argument(
        "--lora-adapter-path",
        type=str,
        default=None,
        help="A PEFT adapter directory (adapter_config.json + weights) to start training from.",
    )


def finalize(args: argparse.Namespace) -> None:
    """--enable-lora / --lora-rank / --lora-adapter-path agree; the values are in range; an adapter
    directory is one before anything starts. The adapter's rank and alpha win over the defaults."""
    need(args.lora_rank is None or args.lora_rank >= 0, f"--lora-rank must be > 0 (or 0: off), got {args.lora_rank}")
    if args.lora_rank == 0:
        need(not args.enable_lora, "--enable-lora with --lora-rank 0: give a rank > 0, or leave LoRA off")
        need(args.lora_adapter_path is None, "--lora-adapter-path with --lora-rank 0: give a rank > 0")
    adapter = _adapter_config(args.lora_adapter_path) if args.lora_adapter_path else None
    args.enable_lora = bool(args.enable_lora or (args.lora_rank or 0) > 0 or adapter is not None)
    if not args.enable_lora:
        return
    if adapter is not None:
        _take_adapter_config(args, adapter)
    if args.lora_rank is None:
        args.lora_rank = DEFAULT_RANK
    need(args.lora_rank > 0, f"--lora-rank must be > 0, got {args.lora_rank}")
    need(args.lora_alpha > 0, f"--lora-alpha must be > 0, got {args.lora_alpha}")
    need(0.0 <= args.lora_dropout < 1.0, f"--lora-dropout must be in [0, 1), got {args.lora_dropout}")
    args.lora_target_modules = _names(args.lora_target_modules) or [ALL_LINEAR]
    args.lora_exclude_modules = _names(args.lora_exclude_modules)
    for option, given in (
        ("--only-train-params-name-list", args.only_train_params_name_list),
        ("--freeze-params-name-list", args.freeze_params_name_list),
    ):
        need(not given, f"{option} with LoRA: only the adapter trains; leave {option} out")
    need(
        not args.ref_update_interval,
        "--ref-update-interval with LoRA: the reference is the base model (the adapter disabled), which "
        "never changes; leave --ref-update-interval out",
    )


def _names(values: list[str] | None) -> list[str]:
    return [n.strip() for v in values or () for n in v.split(",") if n.strip()]


def _adapter_config(path: str) -> dict:
    config = Path(path) / "adapter_config.json"
    need(
        config.is_file(),
        f"--lora-adapter-path {path}: no adapter_config.json there (a PEFT adapter directory holds "
        "adapter_config.json and adapter_model.safetensors; a full model's directory is not an adapter)",
    )
    try:
        data = json.loads(config.read_text())
    except ValueError as e:
        raise SlimeError(f"--lora-adapter-path {path}: {config} is not JSON ({e})") from e
    need(
        isinstance(data, dict) and str(data.get("peft_type", "")).upper() == "LORA",
        f"--lora-adapter-path {path}: {config} is not a LoRA adapter's config (peft_type {data.get('peft_type')!r})",
    )
    need(
        (Path(path) / "adapter_model.safetensors").is_file(),
        f"--lora-adapter-path {path}: adapter_model.safetensors is missing",
    )
    return data


def _take_adapter_config(args: argparse.Namespace, adapter: dict) -> None:
    """The adapter's rank, alpha and target modules (a different --lora-rank is an error)."""
    where = f"--lora-adapter-path {args.lora_adapter_path}"
    rank = int(adapter.get("r", 0))
    need(
        args.lora_rank is None or args.lora_rank == rank,
        f"{where} has rank {rank}, --lora-rank says {args.lora_rank}: leave --lora-rank out or give {rank}",
    )
    args.lora_rank = rank
    if "--lora-alpha" not in args.options_given and adapter.get("lora_alpha") is not None:
        args.lora_alpha = float(adapter["lora_alpha"])
    targets = adapter.get("target_modules")
    if args.lora_target_modules is None and targets:
        args.lora_target_modules = [targets] if isinstance(targets, str) else list(targets)


def startup_note(args: argparse.Namespace) -> str | None:
    """What a LoRA run trains and what its reference is, said once at start-up."""
    if not args.enable_lora:
        return None
    kl = args.use_kl_loss or args.kl_coef != 0.0
    ref = (
        "; the reference policy (KL) is the base model: the policy with its adapter disabled, no second copy"
        if kl
        else ""
    )
    return (
        f"LoRA: rank {args.lora_rank}, alpha {args.lora_alpha:g} (updates scaled by {args.lora_alpha / args.lora_rank:g}) "
        f"on {'every linear layer of the decoder' if args.lora_target_modules == [ALL_LINEAR] else ', '.join(args.lora_target_modules)}"
        f"{' except ' + ', '.join(args.lora_exclude_modules) if args.lora_exclude_modules else ''}; only the adapter "
        f"trains and the engines get the merged weights W0 + (alpha/r)·B·A{ref}{_base_dtype_note(args)}"
    )


def _base_dtype_note(args: argparse.Namespace) -> str:
    if not (args.bf16 or args.fp16):
        return ""
    dtype = "bf16" if args.bf16 else "fp16"
    return (
        f"; the adapted layers' frozen base weights are kept in {dtype} (autocast computes them in {dtype} anyway: "
        "the same bits at half the memory), the adapter in fp32"
    )
