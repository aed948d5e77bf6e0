"""Write slime/arguments/megatron_lm.json: every option of Megatron-LM's argument parser, as data.

    python scripts/extract_megatron_args.py /path/to/Megatron-LM [out.json]

slime launches carry Megatron-LM options (model shape, parallelism, precision, ...); slime-rl
accepts the exact set Megatron-LM's parser defines at the commit slime pins (MEGATRON_COMMIT in
slime's docker/Dockerfile; 1dcf0daf for the file in this repository). This builds that parser
(`megatron.training.arguments.add_megatron_arguments`) from a checkout of Megatron-LM, with the
GPU-only packages it imports replaced by empty stand-ins (only the parser is built, nothing
runs), and records each option's names, dest, action, nargs, type, default and choices.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
from pathlib import Path
from unittest import mock

import torch.utils.flop_counter  # noqa: F401  (torch probes optional packages itself: before any stand-in)

# Packages Megatron-LM imports at module level that a CPU machine does not have.
STAND_INS = (
    "megatron.core.transformer.custom_layers.batch_invariant_kernels", "transformer_engine", "apex", "flash_attn",
    "nvidia_resiliency_ext", "modelopt", "tensorstore", "zarr", "einops", "flashinfer", "mamba_ssm",
    "causal_conv1d", "nvtx", "wandb", "one_logger", "deep_ep", "grouped_gemm", "emerging_optimizers",
    "multistorageclient", "onnx", "sentencepiece", "tiktoken", "nltk", "hydra", "omegaconf", "av",
    "fast_hadamard_transform", "mlflow",
)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in STAND_INS):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__version__ = [], spec, "99.0.0"
        return module

    def exec_module(self, module):
        pass


def _jsonable(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in value):
        return list(value)
    return None


def describe(parser: argparse.ArgumentParser) -> dict[str, dict]:
    out = {}
    for action in parser._actions:
        names = [s for s in action.option_strings if s.startswith("--")]
        if not names or action.dest == "help":
            continue
        choices = action.choices
        out[names[0]] = {
            "aliases": names[1:], "dest": action.dest, "action": type(action).__name__, "nargs": action.nargs,
            "type": getattr(action.type, "__name__", None) if action.type is not None else None,
            "default": _jsonable(action.default), "const": _jsonable(action.const),
            "choices": list(choices) if choices is not None and _jsonable(list(choices)) is not None else None,
        }
    return out


def main() -> None:
    megatron_root = Path(sys.argv[1]).resolve()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parents[1] / "slime/arguments/megatron_lm.json"
    sys.path.insert(0, str(megatron_root))
    sys.meta_path.insert(0, _StandIns())
    from megatron.training.arguments import add_megatron_arguments

    options = describe(add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))
    out.write_text(json.dumps(options, indent=0, sort_keys=True) + "\n")
    print(f"{len(options)} Megatron-LM options -> {out}")


if __name__ == "__main__":
    main()
