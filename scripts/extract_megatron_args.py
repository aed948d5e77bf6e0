"""Write slime/arguments/megatron_lm.json: every option of Megatron-LM's argument parser, as data;
and slime/arguments/megatron_slime_patch.json: the options slime's patches add to that parser.

    python scripts/extract_megatron_args.py /path/to/Megatron-LM [out.json]
    python scripts/extract_megatron_args.py --slime-patches /path/to/slime [--commit SHA] [out.json]

slime launches carry Megatron-LM options (model shape, parallelism, precision, ...); slime-rl
accepts the exact set Megatron-LM's parser defines at the commit slime pins (MEGATRON_COMMIT in
slime's docker/Dockerfile; 1dcf0daf for the file in this repository). This builds that parser
(`megatron.training.arguments.add_megatron_arguments`) from a checkout of Megatron-LM, with the
GPU-only packages it imports replaced by empty stand-ins (only the parser is built, nothing
runs), and records each option's names, dest, action, nargs, type, default and choices.

slime runs a patched Megatron-LM (docker/patch/<version>/megatron*.patch, and the AMD images'
docker/amd_patch/...), whose parser has a few more options that slime's model blocks pass
(`--use-gated-attention`, `--post-self-attn-layernorm`, ...). With `--slime-patches` the `+` side of
every such patch under a slime checkout is read (nothing is applied or imported): each
`add_argument(...)` call added to a Megatron `arguments.py` is replayed on an empty parser and
recorded the same way, with the patches that add it. Every patch version counts, not only
`latest`: an option an older image's patch adds (and a model block still passes) is accepted too.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import textwrap
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


ARGUMENTS_FILE = "arguments.py"  # Megatron's parser: megatron/training/arguments.py
PATCH_GLOBS = (
    "docker/patch/*/megatron*.patch",
    "docker/amd_patch/*/megatron*.patch",
    "docker/npu_patch/megatron*.patch",
)
PATCH_OUT = Path(__file__).parents[1] / "slime/arguments/megatron_slime_patch.json"
_CONVERTERS = {"int": int, "float": float, "str": str}


def added_blocks(patch_text: str) -> list[str]:
    """The runs of consecutive added lines in the hunks of `arguments.py` files, `+` stripped."""
    blocks: list[list[str]] = []
    current_file, run = "", None
    for line in patch_text.splitlines():
        if line.startswith("diff --git "):
            current_file, run = line.split()[-1], None
        elif line.startswith("+") and not line.startswith("+++") and current_file.endswith(ARGUMENTS_FILE):
            if run is None:
                run = []
                blocks.append(run)
            run.append(line[1:])
        else:
            run = None
    return ["\n".join(b) for b in blocks]


def add_argument_calls(block: str) -> list[ast.Call]:
    """Each `*.add_argument(...)` call that starts on a line of `block` and ends inside it."""
    lines, calls = block.split("\n"), []
    for start, line in enumerate(lines):
        if ".add_argument(" not in line:
            continue
        for end in range(start + 1, len(lines) + 1):
            try:
                tree = ast.parse(textwrap.dedent("\n".join(lines[start:end])))
            except SyntaxError:
                continue
            calls += [
                n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"
            ]
            break
    return calls


def replay(call: ast.Call, parser: argparse.ArgumentParser) -> None:
    """`parser.add_argument` with the call's literal arguments (`type=int` etc. by name; help dropped)."""
    names = [ast.literal_eval(a) for a in call.args]
    kwargs = {}
    for kw in call.keywords:
        if kw.arg == "help":
            continue
        if kw.arg == "type":
            kwargs["type"] = _CONVERTERS[ast.unparse(kw.value)]
        else:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    parser.add_argument(*names, **kwargs)


def slime_patch_options(slime_root: Path) -> dict[str, dict]:
    """Option -> its description (as for Megatron's own) plus "patches": the files that add it."""
    out: dict[str, dict] = {}
    patches = sorted({p for pattern in PATCH_GLOBS for p in slime_root.glob(pattern)})
    for patch in patches:
        parser = argparse.ArgumentParser(add_help=False)
        for block in added_blocks(patch.read_text(encoding="utf-8", errors="replace")):
            for call in add_argument_calls(block):
                replay(call, parser)
        rel = patch.relative_to(slime_root).as_posix()
        for name, spec in describe(parser).items():
            known = out.setdefault(name, {**spec, "patches": []})
            if {k: v for k, v in known.items() if k != "patches"} != spec:
                raise SystemExit(f"{name} is defined differently by {rel} and {known['patches']}")
            known["patches"].append(rel)
    return out


def write_slime_patches(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="the options slime's Megatron-LM patches add")
    p.add_argument("slime_root", type=Path)
    p.add_argument("out", type=Path, nargs="?", default=PATCH_OUT)
    p.add_argument("--commit", default=None, help="slime's commit (default: the checkout's HEAD)")
    args = p.parse_intermixed_args(argv)
    commit = (
        args.commit
        or subprocess.run(
            ["git", "-C", str(args.slime_root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    options = slime_patch_options(args.slime_root.resolve())
    data = {"source": {"repo": "THUDM/slime", "commit": commit, "patches": list(PATCH_GLOBS)}, "options": options}
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{len(options)} options added by slime's Megatron-LM patches -> {args.out}")


def main() -> None:
    if sys.argv[1:2] == ["--slime-patches"]:
        write_slime_patches(sys.argv[2:])
        return
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
