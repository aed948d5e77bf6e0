"""Engines and how the rollout reaches them: the backend, weight sync, the router, and the
`--sglang-<arg>` pass-through (forwarded verbatim to every engine as `--<arg>`, checked against
that engine's own parser before anything starts)."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

import torch

from slime.engine.args import build_arg_parser as builtin_engine_parser
from slime.engine.args import option_groups, passthrough_value, sglang_option_names
from slime.errors import SlimeError
from slime.utils.api_keys import new_key

ROLLOUT_BACKENDS = ("sglang", "builtin")
# sglang-router's policies; slime's default is sglang-router's default (`cache_aware`).
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "consistent_hashing", "manual")
DEFAULT_ROUTER_POLICY = "cache_aware"
# slime's transports ('nccl': the collective path, gloo on CPU; colocated: shared memory)
WEIGHT_TRANSPORTS = ("nccl", "disk")
WEIGHT_MODES = ("full", "delta")
DELTA_ENCODINGS = ("xor", "overwrite")
DELTA_CHECKSUMS = ("xxh3-128", "blake3", "adler32")
# an earlier slime-rl spelling of the transport, under a name slime uses for something else
OLD_WEIGHT_MODES = {"tensor": "nccl", "distributed": "nccl"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engines")
    g.add_argument(
        "--rollout-backend",
        choices=ROLLOUT_BACKENDS,
        default=None,
        help="Engine servers: real SGLang (GPUs) or the built-in CPU engine "
        "(default: sglang when CUDA and the sglang package are present, else builtin).",
    )
    g.add_argument(
        "--sglang-config",
        type=str,
        default=None,
        help="slime's YAML of several models, each with its own engines and router (docs/multi-model.md).",
    )
    g.add_argument(
        "--prefill-num-servers",
        type=int,
        default=None,
        help="slime's prefill/decode split of the engines; they run as regular engines here (no disaggregation).",
    )
    _add_weight_sync_arguments(g)
    _add_disk_weight_sync_arguments(g)
    _add_router_and_request_arguments(g)
    _add_fault_tolerance_arguments(p)


def _add_weight_sync_arguments(g: argparse._ArgumentGroup) -> None:
    """How weights reach the engines: the transport, full or delta, the collective's bucket size."""
    g.add_argument(
        "--update-weight-transport",
        type=str,
        default="nccl",
        help="Carrier for weight sync (slime's option; nccl or disk). 'nccl' (default): the collective "
        "path, buckets broadcast over a process group of their own (/init_weights_update_group + "
        "/update_weights_from_distributed; gloo on CPU); with --colocate and the built-in engine "
        "the trainer instead writes the weights once into a shared-memory buffer (/dev/shm) the "
        "engines map (/update_weights_from_shared_memory, the CPU counterpart of SGLang's CUDA "
        "IPC handles). 'disk' writes a complete HF checkpoint (or, in delta mode, a delta) under "
        "--update-weight-disk-dir and the engines reload it (/update_weights_from_disk).",
    )
    # slime's meaning: what is sent (every weight, or only the changed ones); not a transport
    g.add_argument(
        "--update-weight-mode",
        type=str,
        default="full",
        help="Weight sync strategy (slime's option; full or delta). 'full' (default) sends every "
        "parameter every sync. 'delta' diffs each sync against a CPU snapshot of the previous one "
        "and ships only the changed bytes (disk transport only; not with --colocate).",
    )
    g.add_argument(
        "--update-weight-buffer-size",
        type=int,
        default=512 * 1024**2,
        help="buffer size for update weight, in bytes (slime's option): the bucket size of a "
        "collective weight update (one HTTP control call per bucket).",
    )


def _add_disk_weight_sync_arguments(g: argparse._ArgumentGroup) -> None:
    """Disk weight sync: where it writes, deltas and their checks, a post-write hook, an engine-local copy."""
    g.add_argument(
        "--update-weight-disk-dir",
        type=str,
        default=None,
        help="Filesystem directory for disk-backed weight sync (slime's option). In "
        "--update-weight-mode=full, one complete HF checkpoint directory weight_v<N>/ is written "
        "per sync. In delta mode, one delta directory (changed tensors only) is written per sync. "
        "Must be readable by the engines (the engines this run starts may read it).",
    )
    g.add_argument(
        "--update-weight-disk-keep-files",
        action="store_true",
        default=False,
        help="Skip cleanup of full-checkpoint directories written by --update-weight-mode=full "
        "--update-weight-transport=disk (slime's option).",
    )
    g.add_argument(
        "--update-weight-delta-encoding",
        type=str,
        default="xor",
        help="On-disk delta encoding for --update-weight-mode=delta (slime's option; xor or overwrite). "
        "'xor' (default): new ^ old, applied exactly once against the right base. 'overwrite': "
        "changed positions + new values, idempotent. Byte-level and dtype-blind; the engine reads "
        "the choice from each version's index metadata.",
    )
    g.add_argument(
        "--update-weight-delta-checksum",
        type=str,
        default="xxh3-128",
        help="Per-tensor integrity checksum for disk delta apply (slime's option; xxh3-128, blake3 or "
        "adler32). A delta whose result does not match is refused by the engine and a full sync "
        "follows (counted in perf/weight_sync_delta_refused).",
    )
    g.add_argument(
        "--custom-update-weight-post-write-path",
        type=str,
        default=None,
        help="Path to a custom function called after a disk weight sync's files are written (full or "
        "delta), before the engines read them (slime's option). Signature: "
        "``def hook(args, version_dir: str, rollout_engines) -> None``; rollout_engines are the "
        "engines' URLs here.",
    )
    g.add_argument(
        "--update-weight-local-checkpoint-dir",
        type=str,
        default=None,
        help="Rollout-host-local directory holding a full HF checkpoint kept in sync by each engine's "
        "/pull_weights (slime's option): the engine copies a published full checkpoint or patches "
        "published deltas in place, then reloads from it. Required for --update-weight-mode=delta; "
        "optional for full disk sync.",
    )


def _add_router_and_request_arguments(g: argparse._ArgumentGroup) -> None:
    """External engines, the router, and the rollout client's limits on requests to them."""
    g.add_argument(
        "--rollout-external-engine-addrs",
        type=str,
        default=None,
        nargs="+",
        help="Address and ports of the external engines (slime's option): host:port (or "
        "http://host:port) of engine servers this run did not launch, used for rollout (behind a "
        "router when several) and updated by --update-weight-transport (disk, or nccl when the "
        "trainer can reach them). An address that does not answer stops start-up.",
    )
    g.add_argument(
        "--sglang-server-concurrency",
        type=int,
        default=512,
        help="Max in-flight requests per engine from the rollout client.",
    )
    g.add_argument("--sglang-router-ip", type=str, default=None, help="Use an existing router/engine at this address.")
    g.add_argument(
        "--sglang-router-port",
        type=int,
        default=None,
        help="Port of an sglang-router that is already running (with --sglang-router-ip): the run uses it instead of"
        " starting one.",
    )
    g.add_argument(
        "--router-policy",
        choices=ROUTER_POLICIES,
        default=DEFAULT_ROUTER_POLICY,
        help="sglang-router's policy in front of several engines (consistent_hashing or manual: "
        "session affinity by the X-SMG-Routing-Key header).",
    )
    g.add_argument(
        "--sglang-router-request-timeout-secs",
        type=int,
        default=14400,
        help="Timeout in seconds of one request through the router (slime's option): sglang-router's "
        "--request-timeout-secs, and the rollout client's limit on one attempt of a request to "
        "a router or engine; an attempt that runs out is retried.",
    )
    g.add_argument(
        "--rollout-request-max-retries",
        type=int,
        default=60,
        help="Attempts of one rollout HTTP request (engine, router, reward service) before it fails "
        "(slime-rl's own; slime's post() default). Waits between attempts back off up to "
        "--rollout-request-retry-interval.",
    )
    g.add_argument(
        "--rollout-request-retry-interval",
        type=float,
        default=1.0,
        help="Longest wait in seconds between two attempts of a rollout HTTP request (slime-rl's own).",
    )
    g.add_argument(
        "--engine-control-timeout-secs",
        type=float,
        default=600.0,
        help="Timeout in seconds of one control call to an engine (weight update, memory release, "
        "pause; slime-rl's own).",
    )


def _add_fault_tolerance_arguments(p: argparse.ArgumentParser) -> None:
    """Engine health checks and restarts."""
    ft = p.add_argument_group("fault tolerance")
    ft.add_argument(
        "--use-fault-tolerance",
        action="store_true",
        default=False,
        help="Whether to enable the fault tolerance function during rollout (slime's option): a "
        "monitor restarts a dead or hung engine (and the router), gives it the current weights "
        "and puts it back; its lost requests are retried.",
    )
    ft.add_argument(
        "--rollout-health-check-interval",
        type=float,
        default=30.0,
        help="Interval in seconds between rollout engine /health_generate checks during generate/eval.",
    )
    ft.add_argument(
        "--rollout-health-check-timeout",
        type=float,
        default=30.0,
        help="Timeout in seconds to wait for a rollout engine /health_generate response before "
        "killing it (and restarting it).",
    )
    ft.add_argument(
        "--rollout-health-check-first-wait",
        type=float,
        default=0,
        help="Initial grace period (in seconds) before starting health checks, after each resume.",
    )


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def default_rollout_backend() -> str:
    """`sglang` when CUDA and the `sglang` package are both present, else `builtin`."""
    return "sglang" if sglang_installed() and cuda_available() else "builtin"


def finalize(args: argparse.Namespace) -> None:
    if (args.sglang_router_ip is None) != (args.sglang_router_port is None):
        raise SlimeError("--sglang-router-ip and --sglang-router-port must be given together")
    if args.rollout_backend is None:
        args.rollout_backend = default_rollout_backend()
    _finalize_weight_sync(args)
    if hasattr(args, "sglang_args"):  # set by parse_args from the command line's --sglang-* tokens
        args.sglang_args, args.sglang_options_not_used = sort_passthrough(args.sglang_args, args.rollout_backend)
    args.engine_api_key, args.engine_admin_api_key = run_keys(args)
    if args.update_weight_buffer_size < 1:
        raise SlimeError(f"--update-weight-buffer-size must be >= 1 byte, got {args.update_weight_buffer_size}")
    _check_timeouts(args)


def _check_timeouts(args: argparse.Namespace) -> None:
    """Timeouts, retries and health checks that cannot work stop here, naming the option."""
    for opt, dest in (
        ("--sglang-router-request-timeout-secs", "sglang_router_request_timeout_secs"),
        ("--rollout-request-retry-interval", "rollout_request_retry_interval"),
        ("--engine-control-timeout-secs", "engine_control_timeout_secs"),
        ("--rollout-health-check-interval", "rollout_health_check_interval"),
        ("--rollout-health-check-timeout", "rollout_health_check_timeout"),
    ):
        value = getattr(args, dest)
        if not value > 0 or value == float("inf"):
            raise SlimeError(f"{opt} must be a positive number of seconds, got {value}")
    if args.rollout_request_max_retries < 1:
        raise SlimeError(
            f"--rollout-request-max-retries must be >= 1 (attempts in all), got {args.rollout_request_max_retries}"
        )
    if not args.rollout_health_check_first_wait >= 0:
        raise SlimeError(
            f"--rollout-health-check-first-wait must be >= 0 seconds, got {args.rollout_health_check_first_wait}"
        )
    # a timeout longer than the interval is allowed, as slime's monitor allows it: checks never
    # overlap (the watcher waits the interval after each check has finished)
    if args.use_fault_tolerance and args.sglang_router_ip is not None:
        raise SlimeError(
            "--use-fault-tolerance restarts the engines this run starts; with --sglang-router-ip the "
            "router and engines are yours and cannot be restarted from here (drop one of the two)"
        )


def run_keys(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(API key, admin key) of the run's engines and router: the user's `--sglang-api-key` /
    `--sglang-admin-api-key` (SGLang's flags), else one fresh key as both for engines this run
    starts; None for a user's own router/engine without a key (nothing to send it)."""
    tokens = args.sglang_args if hasattr(args, "sglang_args") else []
    api_key, admin = passthrough_value(tokens, "--api-key"), passthrough_value(tokens, "--admin-api-key")
    if (
        api_key is None
        and admin is None
        and args.sglang_router_ip is None
        and args.rollout_external_engine_addrs is None
    ):  # external engines have keys of their own (or none)
        api_key = admin = new_key()
    return api_key, admin


def normalize_engine_addr(addr: str) -> str:
    """`host:port` or `http://host:port` -> `http://host:port` (slime's rule for external engines)."""
    url = (addr if "://" in addr else f"http://{addr}").rstrip("/")
    try:
        parsed = urlparse(url)
        port = parsed.port
    except ValueError:
        port = None
        parsed = None
    if parsed is None or parsed.scheme != "http" or not parsed.hostname or port is None or parsed.path:
        raise SlimeError(
            f"--rollout-external-engine-addrs: {addr!r} is not an engine address; use host:port or "
            "http://host:port (IPv6 in brackets)"
        )
    return url


def _finalize_weight_sync(args: argparse.Namespace) -> None:
    if args.update_weight_mode in OLD_WEIGHT_MODES:
        new = OLD_WEIGHT_MODES[args.update_weight_mode]
        raise SlimeError(
            f"--update-weight-mode {args.update_weight_mode}: in slime this option chooses the payload "
            f"(full or delta); the transport is --update-weight-transport {new}"
        )
    if args.update_weight_mode not in WEIGHT_MODES:
        raise SlimeError(f"--update-weight-mode must be full or delta, got {args.update_weight_mode!r}")
    if args.update_weight_transport == "tensor":
        raise SlimeError(
            "--update-weight-transport tensor (slime-rl's earlier HTTP payload) is gone: slime's nccl "
            "(the default) moves the weights through shared memory when colocated and over a gloo "
            "group otherwise; disk goes through --update-weight-disk-dir"
        )
    if args.update_weight_transport not in WEIGHT_TRANSPORTS:
        raise SlimeError(f"--update-weight-transport must be nccl or disk, got {args.update_weight_transport!r}")
    if args.update_weight_delta_encoding not in DELTA_ENCODINGS:
        raise SlimeError(
            f"--update-weight-delta-encoding must be xor or overwrite, got {args.update_weight_delta_encoding!r}"
        )
    if args.update_weight_delta_checksum not in DELTA_CHECKSUMS:
        raise SlimeError(
            f"--update-weight-delta-checksum must be one of {', '.join(DELTA_CHECKSUMS)}, got "
            f"{args.update_weight_delta_checksum!r}"
        )
    if args.update_weight_delta_checksum == "blake3" and importlib.util.find_spec("blake3") is None:
        raise SlimeError(
            "--update-weight-delta-checksum blake3 needs the blake3 package, which is not installed; "
            "use xxh3-128 (slime's default) or adler32"
        )
    _check_disk_weight_sync(args)
    _finalize_external_engines(args)


def _check_disk_weight_sync(args: argparse.Namespace) -> None:
    """Disk sync and deltas: the directories they need, and what they cannot be combined with."""
    # slime's rules (slime/utils/arguments.py)
    if args.update_weight_transport == "disk" and not args.update_weight_disk_dir:
        raise SlimeError(
            "--update-weight-transport=disk requires --update-weight-disk-dir to point at a filesystem "
            "shared between the trainer and the rollout engines"
        )
    if args.update_weight_mode == "delta":
        if args.update_weight_transport != "disk":
            raise SlimeError(
                f"--update-weight-mode=delta requires --update-weight-transport=disk, got "
                f"{args.update_weight_transport!r}"
            )
        if args.colocate:
            raise SlimeError(
                "--update-weight-mode=delta is not supported with --colocate: colocated engines get the "
                "weights through shared memory, so the delta bookkeeping (snapshot + diff + encode) is "
                "pure overhead"
            )
        if not args.update_weight_local_checkpoint_dir:
            raise SlimeError(
                "--update-weight-mode=delta requires --update-weight-local-checkpoint-dir (a "
                "rollout-host-local directory the engines keep a full checkpoint in)"
            )
    for opt, path in (
        ("--update-weight-disk-dir", args.update_weight_disk_dir),
        ("--update-weight-local-checkpoint-dir", args.update_weight_local_checkpoint_dir),
    ):
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            raise SlimeError(f"{opt} {path!r} exists and is not a directory")
    if (
        args.update_weight_disk_dir
        and args.update_weight_local_checkpoint_dir
        and Path(args.update_weight_disk_dir).resolve() == Path(args.update_weight_local_checkpoint_dir).resolve()
    ):
        raise SlimeError(
            "--update-weight-local-checkpoint-dir must differ from --update-weight-disk-dir (the engines "
            "patch their local copy in place)"
        )


def _finalize_external_engines(args: argparse.Namespace) -> None:
    """Engines this run did not launch: their addresses normalised, and what cannot go with them."""
    if args.rollout_external_engine_addrs is not None:
        args.rollout_external_engine_addrs = [normalize_engine_addr(a) for a in args.rollout_external_engine_addrs]
        if args.sglang_router_ip is not None:
            raise SlimeError(
                "--rollout-external-engine-addrs and --sglang-router-ip both name servers this run did "
                "not launch; give one of the two"
            )
        if args.colocate:
            raise SlimeError(
                "--rollout-external-engine-addrs: external engines are not colocated with the trainer "
                "(their lifecycle is not this run's); drop --colocate"
            )
        if args.use_fault_tolerance:
            raise SlimeError(
                "--use-fault-tolerance restarts engines this run starts; external engines "
                "(--rollout-external-engine-addrs) cannot be restarted from here"
            )


@lru_cache(maxsize=1)
def builtin_engine_option_names() -> frozenset[str]:
    return frozenset(s for a in builtin_engine_parser()._actions for s in a.option_strings)


def sort_passthrough(tokens: list[str], backend: str) -> tuple[list[str], list[str]]:
    """(tokens to forward to every engine, options SGLang knows that the built-in engine cannot use).

    With SGLang every SGLang option is forwarded (its own parser checks values before launch);
    with the built-in engine the ones it does not have are kept out of its command line and named
    once at start-up. A name neither knows is an error, with the closest `--sglang-*` name."""
    sglang, builtin = sglang_option_names(), builtin_engine_option_names()
    forward: list[str] = []
    not_used: list[str] = []
    for group in option_groups(tokens):
        name = group[0].split("=", 1)[0]
        if (backend == "builtin" and name in builtin) or (backend != "builtin" and name in sglang | builtin):
            forward += group
        elif name in sglang:
            not_used.append(" ".join(["--sglang-" + group[0][2:], *group[1:]]))
        else:
            close = difflib.get_close_matches(name, sorted(sglang | builtin), n=1)
            hint = f"; did you mean --sglang-{close[0][2:]}?" if close else ""
            raise SlimeError(
                f"unknown engine argument --sglang-{name[2:]}: neither SGLang's server nor the built-in "
                f"engine has {name}{hint}"
            )
    return forward, not_used


def unused_note(args: argparse.Namespace) -> str | None:
    """One line naming the SGLang options set that the built-in engine does not use."""
    not_used = list(getattr(args, "sglang_options_not_used", None) or [])
    if not not_used:
        return None
    return "SGLang options accepted but not used by the built-in engine: " + "; ".join(not_used)


def split_passthrough(
    argv: list[str], known_options: set[str], prefix: str = "--sglang-"
) -> tuple[list[str], list[str]]:
    """Separate `<prefix><arg> [value]` (pass-through: `--sglang-*` to the engines, `--router-*` to
    sglang-router, each as `--<arg>`) from slime's own arguments."""
    own: list[str] = []
    passthrough: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name.startswith(prefix) and name not in known_options:
            passthrough.append("--" + tok[len(prefix) :])
            # every value up to the next option (`--sglang-cuda-graph-bs 1 2 4` takes three)
            while "=" not in tok and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                passthrough.append(argv[i + 1])
                i += 1
        else:
            own.append(tok)
        i += 1
    return own, passthrough
