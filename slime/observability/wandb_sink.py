"""The Weights & Biases sink of MetricsLogger: one wandb run per run directory, fed the same
scalars and global step as metrics.jsonl and TensorBoard.

Mode (`resolve_mode`): `--wandb-mode` as given, else $WANDB_MODE, else online when an API key is
known (`--wandb-key`, WANDB_API_KEY / WANDB_IDENTITY_TOKEN_FILE, a `wandb login` netrc entry) and
the host answers a TCP connect within `PROBE_TIMEOUT_S`, otherwise offline, said in one line.
Online mode asked for explicitly (`--wandb-mode online` or WANDB_MODE=online) with no key or an
unreachable host stops with a SlimeError before the run starts: a run that was meant to upload
its metrics should not find out at the end that it could not. Offline runs are written under
`<wandb dir>/wandb/offline-run-*` and uploaded later with `wandb sync`.

The run's id is kept in `<run-dir>/wandb_run.json`, so the next stage of the same run directory
(SFT then RL) or a resumed run continues the same wandb run; `--wandb-run-id` names it explicitly.
Configuration: the run's arguments (minus `--wandb-key`) and SLURM_JOB_ID, as slime's.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import string
import threading
import time
from argparse import Namespace
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from slime.errors import SlimeError

__all__ = ["WandbSink", "resolve_mode", "host_reachable", "read_offline_history", "RUN_FILE", "PROBE_TIMEOUT_S"]

RUN_FILE = "wandb_run.json"
PROBE_TIMEOUT_S = 2.0
CONFIG_ENV_VARS = ("SLURM_JOB_ID",)  # slime's whitelist of environment variables in the run config
SECRET_DESTS = ("wandb_key",)  # never written into the run config


def _default_host() -> str:
    host = os.environ.get("WANDB_BASE_URL")
    if host:
        return host
    import wandb

    return wandb.Settings().base_url


def host_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port opens within `timeout` seconds
    (name resolution included: it runs in a thread that is abandoned when time is up)."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if not parts.hostname:
        return False
    port = parts.port or (80 if parts.scheme == "http" else 443)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((parts.hostname, port), timeout=timeout):
                result.append(True)
        except (OSError, ValueError):  # refused, timed out, unresolvable; ValueError: a bad host name (IDNA)
            result.append(False)

    t = threading.Thread(target=probe, name="wandb-host-probe", daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def _have_credentials(key: str | None, host: str) -> bool:
    if key or os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:  # what `wandb login` wrote
        from wandb.sdk.lib.wbauth import read_netrc_auth

        return bool(read_netrc_auth(host=host))
    except Exception:  # noqa: BLE001 - wandb's internal API (moves between versions): no stored login known
        return False


def resolve_mode(
    wandb_mode: str | None,
    wandb_key: str | None,
    wandb_host: str | None,
    *,
    env: Mapping[str, str] | None = None,
    have_credentials: Callable[[str | None, str], bool] | None = None,
    reachable: Callable[[str], bool] | None = None,
) -> tuple[str, str | None]:
    """(wandb mode, why offline was chosen or None). Raises SlimeError when online mode was asked
    for explicitly and cannot work. Contacts the network only to decide an online mode (one TCP
    connect, bounded by PROBE_TIMEOUT_S)."""
    env = os.environ if env is None else env
    have_credentials = have_credentials or _have_credentials
    reachable = reachable or host_reachable
    asked, source = wandb_mode, "--wandb-mode"
    if asked is None and env.get("WANDB_MODE"):
        asked, source = {"dryrun": "offline", "run": "online"}.get(env["WANDB_MODE"], env["WANDB_MODE"]), "WANDB_MODE"
    if asked not in (None, "online"):
        return asked, None
    host = wandb_host or env.get("WANDB_BASE_URL") or _default_host()
    if not have_credentials(wandb_key, host):
        if asked == "online":
            raise SlimeError(
                f"{source} online: no wandb API key (give --wandb-key, set WANDB_API_KEY or run "
                f"`wandb login`), or use --wandb-mode offline and `wandb sync` later"
            )
        return "offline", "no API key (--wandb-key, WANDB_API_KEY or `wandb login`)"
    if not reachable(host):
        if asked == "online":
            raise SlimeError(
                f"{source} online: the wandb host {host} is not reachable (no connection within "
                f"{PROBE_TIMEOUT_S:g} s); use --wandb-mode offline (upload later with `wandb sync`) "
                f"or check the network"
            )
        return "offline", f"{host} is not reachable"
    return "online", None


def _random_suffix(n: int = 8) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _config(args: Namespace) -> dict[str, Any]:
    """The run's arguments as plain JSON values (the API key left out) and slime's env whitelist."""
    cfg = {k: v for k, v in vars(args).items() if k not in SECRET_DESTS}
    cfg = json.loads(json.dumps(cfg, default=str))
    cfg["env_vars"] = {k: v for k, v in os.environ.items() if k in CONFIG_ENV_VARS}
    return cfg


class WandbSink:
    """One wandb run; `log(step, scalars)` writes one history row at `step`."""

    def __init__(self, run: Any, mode: str, note: str | None = None) -> None:
        self.run = run
        self.mode = mode
        self.note = note
        self._last_step: int | None = None
        self._warned_back = False

    @classmethod
    def from_args(cls, args: Namespace, run_dir: str | Path) -> WandbSink | None:
        """Start (or resume) the run for `--use-wandb`; None without it. Prints one line saying
        the mode, the run and where it is written; sets `args.wandb_run_id` as slime does."""
        if not args.use_wandb:
            return None
        mode, why_offline = resolve_mode(args.wandb_mode, args.wandb_key, args.wandb_host)
        import wandb  # lazily: 1 s to import, only with --use-wandb

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        saved: dict[str, Any] = {}
        run_file = run_dir / RUN_FILE
        if run_file.is_file():
            try:
                saved = json.loads(run_file.read_text())
            except (OSError, json.JSONDecodeError):
                saved = {}
            if args.wandb_run_id is not None and saved.get("id") != args.wandb_run_id:
                saved = {}
            elif (saved.get("project"), saved.get("team")) != (args.wandb_project, args.wandb_team):
                saved = {}  # another project's run: start a new one
        if saved.get("id"):
            run_id, group, name = saved["id"], saved.get("group"), saved.get("name")
        else:
            base = args.wandb_group or run_dir.resolve().name
            if args.wandb_random_suffix:  # slime's naming
                group = f"{base}_{_random_suffix()}"
                name = f"{group}-RANK_0"
            else:
                group = name = base
            run_id = args.wandb_run_id

        wandb_dir = Path(args.wandb_dir or os.environ.get("WANDB_DIR") or run_dir)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        settings: dict[str, Any] = {}
        if args.wandb_host:
            settings["base_url"] = args.wandb_host
        if args.wandb_key and mode == "online":
            settings["api_key"] = args.wandb_key
        try:
            run = wandb.init(
                entity=args.wandb_team,
                project=args.wandb_project,
                group=group,
                name=name,
                id=run_id,
                resume="allow" if run_id else None,
                dir=str(wandb_dir),
                mode=mode,
                config=_config(args),
                settings=wandb.Settings(**settings),
                # a resumed run's config takes the new stage's values
                allow_val_change=True,
            )
        except Exception as e:
            raise SlimeError(f"--use-wandb: wandb.init failed ({mode} mode): {type(e).__name__}: {e}") from e

        # slime does the same (slime/observability/wandb_utils.py): hooks read the run's id from args
        args.wandb_run_id = run.id
        if mode != "disabled":
            run_file.write_text(
                json.dumps(
                    {"id": run.id, "group": group, "name": name, "project": args.wandb_project, "team": args.wandb_team}
                )
                + "\n"
            )
        sink = cls(run, mode, why_offline)
        print(f"[slime] {sink.describe(wandb_dir)}", flush=True)
        return sink

    def describe(self, wandb_dir: str | Path | None = None) -> str:
        where = f" in {Path(wandb_dir).resolve() / 'wandb'}" if wandb_dir is not None else ""
        head = f"wandb: {self.mode} run {self.run.id}"
        if self.mode == "offline":
            why = f" ({self.note})" if self.note else ""
            return f"{head}{why}: written{where}; upload it with `wandb sync`"
        if self.mode == "online":
            url = getattr(self.run, "url", None)
            return f"{head}" + (f": {url}" if url else "")
        return f"wandb: {self.mode}: nothing is logged"

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if not scalars:
            return
        if self._last_step is not None and step < self._last_step and not self._warned_back:
            # wandb drops rows whose step goes back (a stage resumed before its last logged row)
            print(
                f"[slime] wandb: step {step} is before the run's last step {self._last_step}; wandb ignores "
                f"such rows (they are in metrics.jsonl)",
                flush=True,
            )
            self._warned_back = True
        self.run.log(dict(scalars), step=step)
        self._last_step = step if self._last_step is None else max(self._last_step, step)

    def close(self) -> None:
        try:
            self.run.finish()
        except Exception as e:  # noqa: BLE001 - printed; the metrics are in metrics.jsonl either way
            print(f"[slime] wandb: finishing the run failed: {type(e).__name__}: {e}", flush=True)


# --------------------------------------------------------------------------- offline run reader
_LOG_BLOCK = 32768
_LOG_HEADER = 7  # checksum (4), length (2), chunk type (1)
_FILE_HEADER = 7  # ":W&B", magic 0xBEE1, version


def _wandb_records(path: Path):
    """The protobuf Records of a `.wandb` file (wandb's LevelDB-style log: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a wandb transaction log")
    pos, pending = _FILE_HEADER, b""
    while pos + _LOG_HEADER <= len(data):
        left = _LOG_BLOCK - pos % _LOG_BLOCK
        if left < _LOG_HEADER:  # block trailer padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if pos + _LOG_HEADER + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + _LOG_HEADER : pos + _LOG_HEADER + length]
        pos += _LOG_HEADER + length
        if kind == 1:  # full
            payload = chunk
        elif kind == 2:  # first
            pending = chunk
            continue
        elif kind == 3:  # middle
            pending += chunk
            continue
        elif kind == 4:  # last
            payload, pending = pending + chunk, b""
        else:  # zero padding
            continue
        rec = pb.Record()
        rec.ParseFromString(payload)
        yield rec


def read_offline_history(
    wandb_dir: str | Path, run_id: str | None = None, *, wait_s: float = 0.0
) -> list[tuple[int, dict[str, Any]]]:
    """(step, {key: value}) of every history row of the offline run(s) under `wandb_dir` (the
    directory holding `wandb/`, or `wandb/` itself), in order; wandb's own `_step`, `_runtime`,
    `_timestamp` left out. With `run_id`, only that run's files (a resumed run has several).

    `run.finish()` can return before wandb's service has written the end of the file: `wait_s`
    waits up to that long for every file to end with its exit record."""
    root = Path(wandb_dir)
    if (root / "wandb").is_dir():
        root = root / "wandb"
    files = sorted(root.glob("offline-run-*/run-*.wandb"), key=lambda p: (p.stat().st_mtime, p.parent.name))
    if run_id is not None:
        files = [f for f in files if f.name == f"run-{run_id}.wandb"]
    deadline = time.monotonic() + wait_s
    records = [list(_wandb_records(f)) for f in files]
    while time.monotonic() < deadline and not all(r and r[-1].WhichOneof("record_type") == "exit" for r in records):
        time.sleep(0.05)
        records = [list(_wandb_records(f)) for f in files]
    rows: list[tuple[int, dict[str, Any]]] = []
    for recs in records:
        for rec in recs:
            if rec.WhichOneof("record_type") != "history":
                continue
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    row[key] = json.loads(item.value_json)
            rows.append((rec.history.step.num, row))
    return rows
