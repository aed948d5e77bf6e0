"""`--rollout-backend sglang`: real SGLang servers (`python -m sglang.launch_server`) on GPUs.

Kept deliberately thin, and NOT run in this repository's tests or on its CPU machines (no GPU,
no `sglang` package): the command construction and the argument validation are unit-tested,
the launch itself is not. Each engine is

    python -m sglang.launch_server --model-path <--hf-checkpoint> --host H --port P
        --tp-size <--rollout-num-gpus-per-engine> --base-gpu-id <engine's first GPU slot>
        --random-seed <--seed + rank> <every --sglang-<arg> forwarded verbatim as --<arg>>

and the rollout client talks to it (or to the router in front of several) exactly as it talks
to the built-in engine: SGLang's native `/generate` and control endpoints.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

from slime.arguments import passthrough_value, passthrough_without
from slime.errors import SlimeError

ROLLOUT_BACKENDS = ("sglang", "builtin")
# Set by the framework from slime's own arguments; a --sglang-<one of these> is an error.
FRAMEWORK_OWNED = {
    "--model-path": "--hf-checkpoint",
    "--tp-size": "--rollout-num-gpus-per-engine",
    "--tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "--base-gpu-id": "the engine's placement (bundle index)",
}


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def default_rollout_backend() -> str:
    """`sglang` when CUDA and the `sglang` package are both present, else `builtin`."""
    return "sglang" if sglang_installed() and cuda_available() else "builtin"


def check_framework_owned(sglang_args: list[str]) -> None:
    for tok in sglang_args:
        name = tok.split("=", 1)[0]
        if name in FRAMEWORK_OWNED:
            raise SlimeError(f"--sglang-{name[2:]} is set by the framework with --rollout-backend sglang "
                             f"(from {FRAMEWORK_OWNED[name]}); remove it")


def sglang_server_command(args: Namespace, rank: int, base_gpu_id: int, port: int) -> tuple[str, list[str]]:
    """(host, argv) of engine `rank`'s `sglang.launch_server`; --sglang-host/--sglang-port win as usual."""
    extra = list(args.sglang_args)
    check_framework_owned(extra)
    host = passthrough_value(extra, "--host") or "127.0.0.1"
    user_port = passthrough_value(extra, "--port")
    port = int(user_port) + rank if user_port else port
    extra = passthrough_without(extra, {"--host", "--port"})
    if passthrough_value(extra, "--random-seed") is None:
        extra += ["--random-seed", str(args.seed + rank)]
    cmd = [sys.executable, "-m", "sglang.launch_server",
           "--model-path", str(args.hf_checkpoint),
           "--host", host, "--port", str(port),
           "--tp-size", str(args.rollout_num_gpus_per_engine),
           "--base-gpu-id", str(base_gpu_id),
           *extra]
    return host, cmd


def sglang_arg_parser() -> argparse.ArgumentParser:
    """SGLang's own server-argument parser (needs the `sglang` package)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def validate_sglang_args(sglang_args: list[str]) -> None:
    """Check the forwarded `--sglang-*` arguments against SGLang's parser, before any launch."""
    if not sglang_installed():
        raise SlimeError("--rollout-backend sglang needs the `sglang` package (and GPUs), which this "
                         "environment does not have; use --rollout-backend builtin")
    check_framework_owned(sglang_args)
    from slime.preflight import check_passthrough_args

    check_passthrough_args(sglang_arg_parser(), sglang_args, "sglang.launch_server")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The SGLang server gets SIGTERM when the process that launched it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_sglang_server(args: Namespace, rank: int, base_gpu_id: int, log_path: str | os.PathLike):
    """Launch engine `rank` as an SGLang server; returns an `EngineProcess` (wait_until_healthy, stop)."""
    from slime.engine.launcher import EngineLaunchError, EngineProcess, find_free_port

    host, cmd = sglang_server_command(args, rank, base_gpu_id, find_free_port())
    port = int(passthrough_value(cmd, "--port"))
    env = dict(os.environ)
    if env.get("CUDA_VISIBLE_DEVICES") == "":  # set empty for GPU-less Ray actors: it would hide every GPU
        env.pop("CUDA_VISIBLE_DEVICES")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "ab")
    log_file.write(("$ " + " ".join(cmd) + "\n").encode())
    log_file.flush()
    try:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    except OSError as e:
        log_file.close()
        raise EngineLaunchError(f"cannot start sglang.launch_server: {e}") from e
    url_host = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
    return EngineProcess(proc, f"http://{url_host}:{port}", host, port, log_path, log_file)
