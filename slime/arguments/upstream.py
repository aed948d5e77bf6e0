"""slime's own options that slime-rl's groups do not define, accepted as slime accepts them.

`slime_upstream.json` is every option of slime's parser (slime/utils/arguments.py, slime's
SGLang-side options and its pre-parse options) at the commit it names, written by
`scripts/extract_slime_args.py`. An option slime-rl defines in its own groups keeps that
definition; every other one is added here with slime's dest and default, so a slime script
parses and `args` carries what slime's would, and then sorted by what it does on this backend:

* `NOT_USED`: GPU-only or Megatron-only (FP8/INT4, MTP, routing replay, DeepGEMM, NIXL, memory
  snapshots, Megatron plugins ...): accepted and named once at start-up, never silently dropped;
* `NOT_SUPPORTED`: features outside this wave (multimodal data, slime's external rollout
  buffer): setting one stops with "not supported yet".

slime's options that are Megatron-LM's too (`--no-save-optim`, `--mtp-num-layers`, ...) are added
with Megatron's and take slime's default (`set_slime_defaults`). Every other slime option is
either defined by slime-rl or in exactly one of the two tables
(tests/arguments/test_slime_arguments.py checks it), so an option added to the data cannot slip
through as silently accepted.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.arguments.from_data import add_options
from slime.errors import SlimeError

DATA = Path(__file__).with_name("slime_upstream.json")

_MEGATRON = "a Megatron-LM training feature; the fsdp backend trains without it"
_GPU = "GPU-only; nothing to do on this backend"

NOT_USED: dict[str, str] = {
    "--allgather-cp": "context parallelism is " + _GPU,
    "--qwen-gdn-backend": "a GPU kernel choice; " + _GPU,
    "--freeze-indexer": "DSA indexer of Megatron's model; " + _MEGATRON,
    "--custom-model-provider-path": "Megatron's model provider; the fsdp backend builds the model from --hf-checkpoint",
    "--custom-megatron-init-path": "a Megatron plugin hook",
    "--megatron-deepgemm-forward-layers": "DeepGEMM is " + _GPU,
    "--megatron-deepgemm-forward-modules": "DeepGEMM is " + _GPU,
    "--megatron-deepgemm-moe-forward-layers": "DeepGEMM is " + _GPU,
    "--megatron-deepgemm-moe-forward-modules": "DeepGEMM is " + _GPU,
    "--megatron-config-path": "per-role Megatron configs; " + _MEGATRON,
    "--use-routing-replay": "MoE routing replay is " + _MEGATRON,
    "--use-rollout-routing-replay": "MoE routing replay is " + _MEGATRON,
    "--enable-mtp-training": "MTP layers are " + _MEGATRON,
    "--num-gpus-per-node": "engines are placed by --rollout-num-gpus / --rollout-num-gpus-per-engine on CPU",
    "--recompute-loss-function": "a GPU memory saving; " + _MEGATRON,
    "--data-pad-size-multiplier": "padding for GPU kernels; batches are not padded to a multiple here",
    "--ref-ckpt-step": "Megatron checkpoint iterations; --ref-load here is a Hugging Face directory",
    "--opd-teacher-ckpt-step": "Megatron checkpoint iterations; --opd-teacher-load here is a Hugging Face directory",
    "--model-name": "Megatron -> Hugging Face weight conversion; weights here are Hugging Face tensors already",
    "--balance-by-flops": "FLOPs-balanced micro-batches for GPU kernels",
    "--rollout-data-transport": "rollout data moves through Ray's object store here (NIXL is GPU-only)",
    "--http-proxy": "rollout requests go to loopback engines here",
    "--use-distributed-post": "rollout requests are posted from the rollout manager here",
}

NOT_SUPPORTED: dict[str, str] = {
    "--multimodal-keys": "multimodal prompts are not supported yet (text models only)",
    "--rollout-buffer-url": "slime's external rollout buffer server is not supported yet",
    "--rollout-task-type": "slime's external rollout buffer server is not supported yet",
    "--fetch-trajectory-retry-times": "slime's external rollout buffer server is not supported yet",
    "--min-batch-collection-ratio": "slime's external rollout buffer server is not supported yet",
}

GROUP_TITLE = "slime options (accepted; GPU-only ones named at start-up as not used)"


@lru_cache(maxsize=1)
def slime_data() -> dict[str, Any]:
    """{"source": {repo, path, commit}, "options": {name: {aliases, dest, group, action, ...}}}."""
    return json.loads(DATA.read_text())


def slime_options() -> dict[str, dict[str, Any]]:
    return slime_data()["options"]


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected JSON, got {value!r} ({e})") from e


_TYPES = {"int": int, "float": float, "str": str, "loads": _loads}


def add_arguments(p: argparse.ArgumentParser, megatron_names: set[str]) -> set[str]:
    """slime's options that no earlier group defined and that are not Megatron-LM's (call after
    slime-rl's own groups); returns the option strings added."""
    known = {s for a in p._actions for s in a.option_strings} | megatron_names
    return add_options(p.add_argument_group(GROUP_TITLE), slime_options(), known, _TYPES)


def set_slime_defaults(p: argparse.ArgumentParser, megatron_added: set[str]) -> None:
    """Megatron-LM options slime re-defaults (`reset_arg` in slime's parser: `--mtp-loss-scaling-factor`
    0.2, ...) take slime's default, as under slime."""
    for name, spec in slime_options().items():
        if name in megatron_added:
            p.set_defaults(**{spec["dest"]: spec["default"]})


def check_given(given: Sequence[str]) -> None:
    """Stop on the first slime option set that is not supported here."""
    for option in given:
        if option in NOT_SUPPORTED:
            raise SlimeError(f"{option}: {NOT_SUPPORTED[option]}")


def unused_note(args: argparse.Namespace) -> str | None:
    """One line naming the slime options the command line set that this backend does not use."""
    unused = [o for o in args.slime_options_given if o in NOT_USED]
    if not unused:
        return None
    return "slime options accepted but not used by the fsdp backend: " + "; ".join(
        f"{o} ({NOT_USED[o]})" for o in unused
    )
