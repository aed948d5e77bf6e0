"""How the fleet launches engine servers, built-in or SGLang, from one set of launch arguments.

`launch_spec(args, rank)` reads what both backends share from slime's command line: host and
port (`--sglang-host` / `--sglang-port` win over the framework's choice, the rank-th engine
taking port + rank), a sampling seed per engine (`--seed` + rank unless `--sglang-random-seed`
is given), and every other `--sglang-<arg>` forwarded verbatim as `--<arg>`. Then:

* built-in (`--rollout-backend builtin`): `python -m slime.engine.server` with the engine's
  thread budget (`--sglang-num-threads` wins);
* SGLang (`--rollout-backend sglang`, GPUs; NOT run in this repository's tests or on its CPU
  machines: the command and the argument check are unit-tested, the launch is not):

      python -m sglang.launch_server --model-path <--hf-checkpoint> --host H --port P
          --tp-size <--rollout-num-gpus-per-engine> --base-gpu-id <engine's first GPU slot>
          <forwarded arguments, --random-seed included>

The rollout client talks to either (or to the router in front of several) over SGLang's native
`/generate` and control endpoints.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slime.arguments.engine import sglang_installed
from slime.engine.args import check_passthrough_args, passthrough_value, passthrough_without
from slime.errors import SlimeError
from slime.ray.engine_process import EngineProcess
from slime.runtime.core_lending import ENV_LEND_FILE
from slime.runtime.cores import pin_to_cores
from slime.utils.api_keys import ENV_ADMIN_API_KEY, ENV_API_KEY
from slime.utils.checkpoint_layout import weight_snapshot_dir
from slime.utils.net import free_port

# Set by the framework from slime's own arguments; a --sglang-<one of these> is an error.
FRAMEWORK_OWNED = {
    "--model-path": "--hf-checkpoint",
    "--tp-size": "--rollout-num-gpus-per-engine",
    "--tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "--base-gpu-id": "the engine's placement (bundle index)",
}
SGLANG_LAUNCH_TIMEOUT_S = 1200  # a large model's first start (weights, CUDA graphs) takes minutes
BUILTIN_LAUNCH_TIMEOUT_S = 300


@dataclass(frozen=True)
class ModelLaunch:
    """What a model of `--sglang-config` sets for its engines: its checkpoint, its server group's
    overrides (as engine arguments, after the `--sglang-*` ones: they win) and GPUs per engine. A
    frozen model's engines never load trained weights, so they get no weight-load directories."""

    model_path: str
    extra_args: tuple[str, ...] = ()
    num_gpus: int | None = None  # None: --rollout-num-gpus-per-engine
    frozen: bool = False


@dataclass
class LaunchSpec:
    """Engine `rank`'s address and its forwarded arguments (host and port taken out, seed added)."""

    host: str
    port: int | None  # None: the launcher picks a free port
    extra: list[str]


def launch_spec(args: Namespace, rank: int) -> LaunchSpec:
    tokens = list(args.sglang_args)
    port = passthrough_value(tokens, "--port")
    # the launcher passes these (the keys: args.engine_api_key / engine_admin_api_key)
    extra = passthrough_without(tokens, {"--host", "--port", "--api-key", "--admin-api-key"})
    if passthrough_value(extra, "--random-seed") is None:
        extra += ["--random-seed", str(args.seed + rank)]
    return LaunchSpec(
        host=passthrough_value(tokens, "--host") or "127.0.0.1", port=int(port) + rank if port else None, extra=extra
    )


def start_engine(
    args: Namespace,
    rank: int,
    *,
    num_threads: int,
    base_gpu_id: int,
    log_path: str | os.PathLike,
    port: int | None = None,
    cores: Sequence[int] | None = None,
    lend_file: str | None = None,
    model: ModelLaunch | None = None,
) -> EngineProcess:
    """Launch engine `rank` with `--rollout-backend`'s server; returns at once (see wait_until_healthy).
    `port`: the port of the engine it replaces (a restart keeps the engine's address).

    Runs in the engine's Ray actor, on the engine's node: the placement's `cores` for this engine
    bind this process and so the server it starts, which runs `num_threads` threads (the placement's
    count for those cores, else the thread budget) and lends its cores through `lend_file` while it
    idles (the built-in engine only: an SGLang server's slots are GPUs). `model`: the engine's
    model of --sglang-config (None: --hf-checkpoint)."""
    model = model or ModelLaunch(args.hf_checkpoint)
    if args.rollout_backend == "sglang":
        return _start_sglang_server(args, rank, base_gpu_id, log_path, port=port, model=model)
    if cores:
        pin_to_cores(cores)
    spec = launch_spec(args, rank)
    threads = passthrough_value(spec.extra, "--num-threads")  # the user's thread count wins
    extra = passthrough_without(spec.extra, {"--num-threads"}) + list(model.extra_args)
    if model.frozen:
        return _start_builtin(args, model, spec, port, int(threads or num_threads), extra, log_path, lend_file)
    if args.use_fault_tolerance:  # a restarted engine loads the trainer's weight snapshot from here
        extra = _last_weight_load_dirs(extra + ["--weight-load-dirs", str(weight_snapshot_dir(args.run_dir))])
    if args.update_weight_transport == "disk":  # the engine reads published versions (and patches its local copy)
        dirs = [d for d in (args.update_weight_disk_dir, args.update_weight_local_checkpoint_dir) if d]
        extra = _last_weight_load_dirs(extra + ["--weight-load-dirs", *map(str, dirs)])
    return _start_builtin(args, model, spec, port, int(threads or num_threads), extra, log_path, lend_file)


def _start_builtin(
    args: Namespace,
    model: ModelLaunch,
    spec: LaunchSpec,
    port: int | None,
    threads: int,
    extra: list[str],
    log_path: str | os.PathLike,
    lend_file: str | None,
) -> EngineProcess:
    env = key_env(args)
    if lend_file:  # its cores go to a trainer rank while it idles
        env[ENV_LEND_FILE] = lend_file
    return EngineProcess.start(
        model.model_path,
        host=spec.host,
        port=port or spec.port,
        num_threads=threads,
        extra_args=extra,
        log_path=log_path,
        env=env,
        mkl_vendor_shim=args.mkl_vendor_shim,
    )


def _last_weight_load_dirs(extra: list[str]) -> list[str]:
    """One `--weight-load-dirs` (the framework's snapshot directory plus the user's): nargs='*'
    keeps only the last occurrence, so the user's own must not be a second one."""
    head, dirs, i = [], [], 0
    while i < len(extra):
        if extra[i] == "--weight-load-dirs":
            i += 1
            while i < len(extra) and not extra[i].startswith("--"):
                dirs.append(extra[i])
                i += 1
        else:
            head.append(extra[i])
            i += 1
    return head + ["--weight-load-dirs", *dict.fromkeys(dirs)]


def key_env(args: Namespace) -> dict[str, str]:
    """The run's keys for a built-in engine or dispatcher: in its environment, which (unlike a
    command line) other local users cannot read."""
    env = {}
    if args.engine_api_key is not None:
        env[ENV_API_KEY] = args.engine_api_key
    if args.engine_admin_api_key is not None:
        env[ENV_ADMIN_API_KEY] = args.engine_admin_api_key
    return env


# ------------------------------------------------------------------------------------ SGLang
def check_framework_owned(sglang_args: list[str]) -> None:
    for tok in sglang_args:
        name = tok.split("=", 1)[0]
        if name in FRAMEWORK_OWNED:
            raise SlimeError(
                f"--sglang-{name[2:]} is set by the framework with --rollout-backend sglang "
                f"(from {FRAMEWORK_OWNED[name]}); remove it"
            )


def sglang_server_command(
    args: Namespace, rank: int, base_gpu_id: int, port: int, model: ModelLaunch | None = None
) -> tuple[str, list[str]]:
    """(host, argv) of engine `rank`'s `sglang.launch_server`; `port` unless --sglang-port is given;
    `model`: its --sglang-config model (checkpoint, GPUs per engine, overrides last so they win)."""
    check_framework_owned(args.sglang_args)
    model = model or ModelLaunch(args.hf_checkpoint)
    spec = launch_spec(args, rank)
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model.model_path),
        "--host",
        spec.host,
        "--port",
        str(spec.port or port),
        "--tp-size",
        str(model.num_gpus or args.rollout_num_gpus_per_engine),
        "--base-gpu-id",
        str(base_gpu_id),
        *spec.extra,
        *model.extra_args,
    ]
    # SGLang reads its keys from the command line only (visible to local users; see docs/security.md)
    if args.engine_api_key is not None:
        cmd += ["--api-key", args.engine_api_key]
    if args.engine_admin_api_key is not None:
        cmd += ["--admin-api-key", args.engine_admin_api_key]
    return spec.host, cmd


def sglang_arg_parser() -> argparse.ArgumentParser:
    """SGLang's own server-argument parser (needs the `sglang` package)."""
    from sglang.srt.server_args import ServerArgs  # optional dependency: GPU machines only

    parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def validate_sglang_args(sglang_args: list[str]) -> None:
    """Check the forwarded `--sglang-*` arguments against SGLang's parser, before any launch."""
    if not sglang_installed():
        raise SlimeError(
            "--rollout-backend sglang needs the `sglang` package (and GPUs), which this "
            "environment does not have; use --rollout-backend builtin"
        )
    check_framework_owned(sglang_args)
    check_passthrough_args(sglang_arg_parser(), sglang_args, "sglang.launch_server")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The SGLang server gets SIGTERM when the process that launched it dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start_sglang_server(
    args: Namespace,
    rank: int,
    base_gpu_id: int,
    log_path: str | os.PathLike,
    port: int | None = None,
    model: ModelLaunch | None = None,
) -> EngineProcess:
    host, cmd = sglang_server_command(args, rank, base_gpu_id, port or free_port(), model=model)
    port = int(passthrough_value(cmd, "--port"))
    env = dict(os.environ)
    if env.get("CUDA_VISIBLE_DEVICES") == "":  # set empty for GPU-less Ray actors: it would hide every GPU
        env.pop("CUDA_VISIBLE_DEVICES")
    return EngineProcess.spawn(
        cmd, host, port, Path(log_path), env, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None
    )
