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
import json
import sys
from pathlib import Path

import torch.utils.flop_counter  # noqa: F401  (torch probes optional packages itself: before any stand-in)
from parser_tables import StandIns, describe

# Packages Megatron-LM imports at module level that a CPU machine does not have.
STAND_INS = (
    "megatron.core.transformer.custom_layers.batch_invariant_kernels",
    "transformer_engine",
    "apex",
    "flash_attn",
    "nvidia_resiliency_ext",
    "modelopt",
    "tensorstore",
    "zarr",
    "einops",
    "flashinfer",
    "mamba_ssm",
    "causal_conv1d",
    "nvtx",
    "wandb",
    "one_logger",
    "deep_ep",
    "grouped_gemm",
    "emerging_optimizers",
    "multistorageclient",
    "onnx",
    "sentencepiece",
    "tiktoken",
    "nltk",
    "hydra",
    "omegaconf",
    "av",
    "fast_hadamard_transform",
    "mlflow",
)


def main() -> None:
    megatron_root = Path(sys.argv[1]).resolve()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parents[1] / "slime/arguments/megatron_lm.json"
    sys.path.insert(0, str(megatron_root))
    StandIns(STAND_INS, version="99.0.0").install()
    from megatron.training.arguments import add_megatron_arguments

    options = describe(add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))
    out.write_text(json.dumps(options, indent=0, sort_keys=True) + "\n")
    print(f"{len(options)} Megatron-LM options -> {out}")


if __name__ == "__main__":
    main()
