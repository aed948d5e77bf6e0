"""The built-in engine's command line, and the checks the trainer side borrows from it.

    python -m slime.engine.server --model-path DIR [--host 127.0.0.1] [--port 30000] ...

Flag names are SGLang's where SGLang has the same knob, so `--sglang-<flag>` on a slime command
line means the same to either engine. The trainer side validates its pass-through tokens here
(`check_passthrough_args`) before anything starts; the engine never imports the trainer side.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from slime.engine.parsing import REASONING_PARSERS, TOOL_PARSERS
from slime.errors import SlimeError
from slime.utils.api_keys import ENV_ADMIN_API_KEY, ENV_API_KEY
from slime.utils.misc import argv_value

if TYPE_CHECKING:  # torch is imported where a device is resolved, not by the argument parser
    import torch

MODEL_IMPLS = ("auto", "native", "sglang", "transformers")


def server_threads(args: argparse.Namespace) -> int:
    """Torch threads of the server: `--num-threads`, else every core this process may run on (a
    server started on its own has the machine; inside a run the launcher passes the run's budget)."""
    from slime.runtime.threads import available_cores

    return args.num_threads if args.num_threads and args.num_threads > 0 else available_cores()


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slime serve",  # also `python -m slime.engine.server`
        description="slime's built-in inference engine (a subset of SGLang's HTTP API, CPU).",
    )
    _add_model_args(p)
    p.add_argument("--random-seed", type=int, default=0, help="seed of sampling without sampling_seed")
    p.add_argument("--max-running-requests", type=int, default=256, help="rows in one batch at most")
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="max prompt + new tokens (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        help="wait up to this long for more requests before starting a batch",
    )
    p.add_argument("--weight-version", default="default", help="initial weight_version")
    p.add_argument(
        "--step-delay-ms",
        type=float,
        default=0.0,
        help="sleep this long after every decode step (testing aborts and pauses only)",
    )
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone (no orphan servers)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument(
        "--mkl-vendor-shim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="started as a command on an x86 CPU not made by Intel: start again with a one-function "
        "library preloaded that makes Intel MKL pick its matrix kernels by the CPU's instruction "
        "sets rather than its vendor (slime.runtime.mkl_vendor)",
    )
    _add_kv_cache_args(p)
    _add_openai_args(p)
    p.add_argument(
        "--model-impl",
        default="auto",
        choices=list(MODEL_IMPLS),
        help="forward implementation (SGLang's flag): native (the engine's own, Llama-family models; "
        "'sglang' is an alias), transformers (the model's HF forward), auto (native where it covers "
        "the model)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    _add_guard_args(p)
    return p


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The model, where the server listens, and what it runs on."""
    p.add_argument(
        "--model-path",
        "--hf-checkpoint",
        dest="model_path",
        required=True,
        help="local HF model directory (--hf-checkpoint is slime's name for it)",
    )
    p.add_argument("--tokenizer-path", default=None, help="defaults to --model-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--device",
        default=None,
        help="cpu, cuda or cuda:N (SGLang's flag; default: cuda when torch sees a GPU, else cpu). On "
        "CUDA the model, KV pool and forward run on the GPU (the torch path; the C kernels are "
        "CPU-only) and --mem-fraction-static is a share of that GPU's memory",
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch threads of this server (default: every core this process may run on; a "
        "training run passes its own budget)",
    )


def _add_kv_cache_args(p: argparse.ArgumentParser) -> None:
    """The KV cache: prefix reuse and the token budget of the running batch."""
    p.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="no prefix reuse at all: neither identical prompts in a batch nor the prefix cache (SGLang's flag name)",
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=16384,
        help="token positions of KV kept from finished requests for later requests with the same prefix (0: off)",
    )
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="fraction of the device's memory (the GPU's on --device cuda, else the machine's RAM) for "
        "weights + KV cache; sets the KV token budget (SGLang's meaning; default: no token budget, "
        "only --max-running-requests)",
    )
    p.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="KV token budget of the running batch (overrides --mem-fraction-static)",
    )


def _add_openai_args(p: argparse.ArgumentParser) -> None:
    """The OpenAI-compatible routes (/v1/models, /v1/completions, /v1/chat/completions)."""
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model's id in /v1/models and in /v1 answers (SGLang's flag; default: --model-path)",
    )
    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=list(TOOL_PARSERS),
        help="/v1/chat/completions with tools: parse the model's tool calls from its output in this "
        "format (SGLang's flag and names; default: none, the output is plain content)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=list(REASONING_PARSERS),
        help="/v1/chat/completions: split the model's reasoning (<think>...</think>) off into "
        "reasoning_content (SGLang's flag and names)",
    )


def _add_guard_args(p: argparse.ArgumentParser) -> None:
    """Who may call the server and how much they may send (`slime.engine.guard`)."""
    p.add_argument(
        "--api-key",
        default=os.environ.get(ENV_API_KEY),
        help="every endpoint but /health and /health_generate needs 'Authorization: Bearer <key>' "
        f"(SGLang's flag; default: ${ENV_API_KEY}, which keeps it off the command line)",
    )
    p.add_argument(
        "--admin-api-key",
        default=os.environ.get(ENV_ADMIN_API_KEY),
        help="weight and control endpoints (weight updates, pause/continue, memory, abort, flush_cache) "
        f"need this key, and the API key no longer opens them (SGLang's flag; default: "
        f"${ENV_ADMIN_API_KEY})",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=8192,
        help="waiting requests at most; more answer HTTP 503 (SGLang's flag; the rollout client retries)",
    )
    p.add_argument(
        "--max-batch-request-size",
        type=int,
        default=1024,
        help="prompts in one batch /generate request at most (more: HTTP 400)",
    )
    p.add_argument(
        "--max-request-body-mb",
        type=float,
        default=64.0,
        help="request bodies larger than this answer HTTP 413 (weight updates: --max-weight-update-mb)",
    )
    p.add_argument(
        "--max-weight-update-mb",
        type=float,
        default=None,
        help="body cap of /update_weights_from_tensor (default: room for the model's weights in "
        "float32, base64-encoded)",
    )
    p.add_argument(
        "--weight-load-dirs",
        nargs="*",
        default=[],
        help="/update_weights_from_disk loads only from these directories (and --model-path itself)",
    )


# SGLang's server options (`sglang.launch_server`'s parser as slime's patches extend it), read from
# sglang/srt/server_args.py by scripts/extract_sglang_args.py.
SGLANG_OPTIONS = Path(__file__).resolve().parents[1] / "arguments" / "sglang_server_args.json"


@lru_cache(maxsize=1)
def sglang_option_names() -> frozenset[str]:
    """Every option name (aliases included) of SGLang's server parser as slime's patches extend it
    (`--custom-pull-weights-pre-read-hook`, ...)."""
    data = json.loads(SGLANG_OPTIONS.read_text())
    return frozenset(data["options"]) | frozenset(data["aliases"])


def option_groups(tokens: Sequence[str]) -> list[list[str]]:
    """["--a", "1", "--b"] -> [["--a", "1"], ["--b"]] (pass-through tokens keep their values)."""
    groups: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


def sglang_option(name: str) -> str | None:
    """SGLang's name for `name`: itself, or the one option it abbreviates (argparse lets
    `sglang.launch_server --tp 1` mean `--tp-size 1`); None when SGLang has no such option."""
    names = sglang_option_names()
    if name in names:
        return name
    longer = [n for n in names if n.startswith(name)]
    return longer[0] if len(longer) == 1 else None


def parse_server_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """`slime serve`'s command line, and the SGLang server options in it that this engine does not
    use (`--chunked-prefill-size 4096`, `--tp 1`, ...). Those are accepted so that a script written
    for `python -m sglang.launch_server` (a teacher or judge server slime's examples start beside
    the run) runs with `python -m slime.engine.server` in its place; the server names them at
    start-up. A name neither engine has is an error, as before."""
    parser = build_arg_parser()
    args, rest = parser.parse_known_args(argv)
    not_used: list[str] = []
    for group in option_groups(rest):
        name = group[0].split("=", 1)[0]
        if not name.startswith("--") or sglang_option(name) is None:
            known = sorted({s for a in parser._actions for s in a.option_strings} | sglang_option_names())
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            parser.error(f"unrecognized arguments: {' '.join(group)}: neither this engine nor SGLang has {name}{hint}")
        not_used.append(" ".join(group))
    return args, not_used


def resolve_device(name: str | None) -> torch.device:
    """`--device`: None (or auto) is cuda when torch sees a GPU, else cpu; a CUDA device this
    machine does not have is a SlimeError naming the option and what the machine has."""
    import torch

    from slime.utils.accelerator import cuda_available, parse_device

    if name is None or name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if cuda_available() else torch.device("cpu")
    dev = parse_device(name, "--device")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def check_model_dir(path: str | None, arg: str) -> None:
    """`path` is a local Hugging Face model directory with a readable config and weights."""
    if not path:
        raise SlimeError(f"{arg} is required (a local Hugging Face model directory)")
    p = Path(path)
    if not p.is_dir():
        raise SlimeError(f"{arg} {path}: not a directory")
    config = p / "config.json"
    if not config.is_file():
        raise SlimeError(f"{arg} {path}: no config.json (not a Hugging Face model directory)")
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise SlimeError(f"{arg} {path}: cannot read config.json: {e}") from e
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise SlimeError(f"{arg} {path}: no weight files (*.safetensors or *.bin)")


# ------------------------------------------------------------------------- pass-through tokens
# A slime command line forwards `--sglang-<flag> [values]` to every engine as `--<flag> [values]`;
# these read and edit such token lists.


passthrough_value = argv_value  # the value of a flag in forwarded engine arguments, else None


def passthrough_without(tokens: Sequence[str], flags: set[str]) -> list[str]:
    """Forwarded engine arguments with `flags` (and their values) removed."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(tokens):
        if skip:
            skip = False
            continue
        if tok.split("=", 1)[0] in flags:
            skip = "=" not in tok and i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            continue
        out.append(tok)
    return out


def check_passthrough_args(
    parser: argparse.ArgumentParser,
    tokens: list[str],
    engine: str,
    prefix: str = "--sglang-",
    kind: str = "engine",
    required: tuple[str, ...] = ("--model-path", "x"),
) -> None:
    """Validate forwarded `<prefix>*` tokens (as `--<arg>`) against the parser of the program that
    will run them (`--sglang-*`: the engine's; `--router-*`: sglang-router's)."""
    known = sorted({s for a in parser._actions for s in a.option_strings})
    for tok in tokens:
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0]
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {prefix}{close[0][2:]}?" if close else ""
            raise SlimeError(f"unknown {kind} argument {prefix}{name[2:]} ({engine} has no {name}){hint}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args([*required, *tokens])
    except SystemExit as e:
        msg = err.getvalue().strip().splitlines()
        raise SlimeError(f"invalid {prefix}* arguments for {engine}: {msg[-1] if msg else ' '.join(tokens)}") from e


def check_engine_args(tokens: list[str]) -> None:
    """Validate `--sglang-*` pass-through against the built-in engine's own parser."""
    check_passthrough_args(build_arg_parser(), tokens, "the built-in engine")
