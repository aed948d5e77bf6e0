"""The router in front of several engines, and its runtime membership.

* `start_router(worker_urls, policy=..., log_dir=..., extra_args=...)` launches the real
  `sglang-router` (Rust, PyPI) with `--router-policy` and any other of its options a slime script
  gives as `--router-<arg>` (checked against its own parser by `check_router_args` first), on 127.0.0.1 with its prometheus port on 127.0.0.1 too (both
  default to 0.0.0.0 there). It runs as `python -m slime.ray.router`, which goes through
  sglang_router's Python API: its CLI does not offer `consistent_hashing`, the API does.
  If `sglang-router` is not installed, a log line says so and slime's own small dispatcher
  (`slime.ray.dispatcher`: round robin, routing-key stickiness) takes its place.
* Both speak the same membership API: `GET /workers`, `POST /workers {"url"}`,
  `DELETE /workers/{id}`; `RouterProcess.add_worker/remove_worker` use it (and so does
  `slime.ray.engine_watcher`, which removes engines that died).
* Session affinity: requests carrying `X-SMG-Routing-Key: <session_id>` stick to one engine
  under `consistent_hashing` or `manual` (and always under the built-in dispatcher).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from slime.arguments.engine import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES
from slime.engine.args import check_passthrough_args
from slime.errors import SlimeError
from slime.ray.engine_process import child_env
from slime.runtime.process import pid_alive
from slime.utils.api_keys import ENV_ADMIN_API_KEY, ENV_API_KEY
from slime.utils.http_utils import ROUTING_KEY_HEADER
from slime.utils.net import free_port

logger = logging.getLogger(__name__)


def sglang_router_available() -> bool:
    try:
        return importlib.util.find_spec("sglang_router") is not None
    except (ImportError, ValueError):  # a module entry of None (tests simulate its absence so)
        return False


class RouterProcess:
    """A running router (sglang-router or the built-in dispatcher) and its membership API."""

    def __init__(
        self,
        kind: str,
        host: str,
        port: int,
        proc: subprocess.Popen,
        log_path: Path | None,
        metrics_port: int | None = None,
        admin_api_key: str | None = None,
    ):
        self.kind, self.host, self.port, self.proc = kind, host, port, proc
        self.log_path, self.metrics_port = log_path, metrics_port
        # membership is the router's control plane: the admin key (the run's key when one)
        auth = {"Authorization": f"Bearer {admin_api_key}"} if admin_api_key else {}
        self._client = httpx.Client(timeout=10.0, trust_env=False, headers=auth)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait_until_healthy(self, timeout: float = 60.0) -> RouterProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SlimeError(f"{self.kind} exited with code {self.proc.returncode}; see {self.log_path}")
            try:
                if self._client.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise SlimeError(f"{self.kind} did not become healthy in {timeout:.0f} s; see {self.log_path}")

    # ---- membership
    def workers(self) -> list[dict]:
        """[{"id", "url", "is_healthy", ...}] as the router reports them."""
        resp = self._client.get(self.url + "/workers")
        resp.raise_for_status()
        return list(resp.json().get("workers", []))

    def worker_urls(self) -> list[str]:
        return [w["url"] for w in self.workers()]

    def add_worker(self, url: str, timeout: float = 30.0) -> str:
        """Register `url`; returns its worker id once the router lists it (registration is async)."""
        resp = self._client.post(self.url + "/workers", json={"url": url})
        if resp.status_code >= 400:
            raise SlimeError(f"router refused worker {url}: HTTP {resp.status_code} {resp.text[:300]}")
        worker_id = resp.json().get("worker_id")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if url in self.worker_urls():
                return worker_id
            time.sleep(0.05)
        raise SlimeError(f"router did not list worker {url} within {timeout:.0f} s; see {self.log_path}")

    def remove_worker(self, url: str, timeout: float = 10.0) -> bool:
        """Deregister `url`; False if the router did not have it."""
        ids = [w["id"] for w in self.workers() if w["url"] == url]
        if not ids:
            return False
        for worker_id in ids:
            resp = self._client.delete(f"{self.url}/workers/{worker_id}")
            if resp.status_code >= 400 and resp.status_code != 404:
                raise SlimeError(f"router refused to remove {url}: HTTP {resp.status_code} {resp.text[:300]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and url in self.worker_urls():
            time.sleep(0.05)
        return True

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._client.close()


# set from slime-rl's own options (--router-policy) and the engines it starts
ROUTER_OWNED = {
    "--worker-urls": "the engines this run starts",
    "--policy": "--router-policy",
    "--api-key": "the run's key (--sglang-api-key)",
    "--control-plane-api-keys": "the run's key (--sglang-admin-api-key, else --sglang-api-key)",
}


def router_option_parser() -> argparse.ArgumentParser:
    """sglang-router's own parser (its options without slime's `--router-` prefix)."""
    from sglang_router.router_args import RouterArgs  # optional dependency (router extra)

    p = argparse.ArgumentParser(prog="sglang-router", add_help=False, allow_abbrev=False)
    RouterArgs.add_cli_args(p, use_router_prefix=False, exclude_host_port=True)
    return p


def check_router_args(tokens: list[str]) -> str | None:
    """Check `--router-*` pass-through (as `--<arg>` tokens) against sglang-router's parser before
    anything starts; returns a start-up note when there is no sglang-router to take them."""
    if not tokens:
        return None
    shown = " ".join("--router-" + t[2:] if t.startswith("--") else t for t in tokens)
    if not sglang_router_available():
        return f"sglang-router is not installed: {shown} not used (the built-in dispatcher takes none)"
    for name in (tok.split("=", 1)[0] for tok in tokens):
        if name in ROUTER_OWNED:
            raise SlimeError(f"--router-{name[2:]} is set by the framework ({ROUTER_OWNED[name]})")
    check_passthrough_args(
        router_option_parser(), tokens, "sglang-router", prefix="--router-", kind="router", required=()
    )
    return None


def sglang_router_command(
    policy: str,
    host: str,
    port: int,
    metrics_port: int,
    worker_urls: Iterable[str],
    model_path: str | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    """`python -m slime.ray.router ...`: sglang-router through its Python API, bound to `host`."""
    if policy not in ROUTER_POLICIES:
        raise SlimeError(f"--router-policy {policy!r}: choose from {', '.join(ROUTER_POLICIES)}")
    cmd = [
        sys.executable,
        "-m",
        "slime.ray.router",
        "--parent-pid",
        str(os.getpid()),
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
        "--policy",
        policy,
    ]
    if model_path:  # lets cache_aware tokenize token-id requests
        cmd += ["--model-path", str(model_path)]
    cmd += list(extra)  # the user's --router-* options, after the framework's (argparse: the last wins)
    urls = list(worker_urls)
    if urls:
        cmd += ["--worker-urls", *urls]
    return cmd


def dispatcher_command(host: str, port: int, worker_urls: Iterable[str]) -> list[str]:
    urls = list(worker_urls)
    cmd = [
        sys.executable,
        "-m",
        "slime.ray.dispatcher",
        "--parent-pid",
        str(os.getpid()),
        "--host",
        host,
        "--port",
        str(port),
    ]
    return cmd + (["--worker-urls", *urls] if urls else [])


def start_router(
    worker_urls: list[str],
    *,
    log_dir: str | os.PathLike,
    policy: str = DEFAULT_ROUTER_POLICY,
    model_path: str | None = None,
    extra_args: Iterable[str] = (),
    api_key: str | None = None,
    admin_api_key: str | None = None,
    port: int | None = None,
    request_timeout_secs: int | None = None,
) -> RouterProcess:
    """Start the router for `worker_urls` (sglang-router, or the built-in dispatcher without it);
    `extra_args`: sglang-router's own options (`--router-*` as `--<arg>`). With `api_key`, clients
    need it (the admin key, when given, for membership) and the router sends it to the engines."""
    host = "127.0.0.1"
    port = port or free_port(host)  # a restarted router keeps its address (clients hold it)
    if request_timeout_secs is not None:  # slime's --sglang-router-request-timeout-secs; the user's own wins
        extra_args = ["--request-timeout-secs", str(request_timeout_secs), *extra_args]
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    if sglang_router_available():
        kind, metrics_port = "sglang-router", free_port(host)
        cmd = sglang_router_command(
            policy, host, port, metrics_port, worker_urls, model_path=model_path, extra=extra_args
        )
        log_path = log_dir / "router.log"
    else:
        logger.warning(
            "sglang-router is not installed (pip install sglang-router); using slime's built-in "
            "round-robin dispatcher instead (--router-policy %s is not applied; requests with "
            "%s still stick to one engine)",
            policy,
            ROUTING_KEY_HEADER,
        )
        kind, metrics_port = "builtin-dispatcher", None
        cmd = dispatcher_command(host, port, worker_urls)
        if request_timeout_secs is not None:
            cmd += ["--request-timeout-secs", str(request_timeout_secs)]
        log_path = log_dir / "dispatcher.log"
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(_key_env(api_key, admin_api_key)),
        )
    router = RouterProcess(
        kind, host, port, proc, log_path, metrics_port, admin_api_key=admin_api_key or api_key
    ).wait_until_healthy()
    # Registration is asynchronous in sglang-router: wait until every worker is listed.
    deadline = time.monotonic() + 60
    while set(worker_urls) - set(router.worker_urls()):
        if time.monotonic() > deadline:
            router.stop()
            raise SlimeError(f"{kind} did not register every engine within 60 s; see {log_path}")
        time.sleep(0.05)
    logger.info("%s (policy %s) at %s fronts %d engines", kind, policy, router.url, len(worker_urls))
    return router


def _key_env(api_key: str | None, admin_api_key: str | None) -> dict[str, str]:
    """Keys travel in the environment: a command line is readable by every local user."""
    env = {ENV_API_KEY: api_key} if api_key else {}
    if admin_api_key:
        env[ENV_ADMIN_API_KEY] = admin_api_key
    return env


def apply_keys(router_args, api_key: str | None, admin_api_key: str | None) -> None:
    """sglang-router's keys: `api_key` is required from clients on the data plane and sent to the
    workers; the control plane (/workers) takes the admin key as an admin-role API key."""
    if api_key:
        router_args.api_key = api_key
    control = admin_api_key or api_key
    if control:  # (id, name, key, role), as sglang_router parses --control-plane-api-keys
        router_args.control_plane_api_keys = [("slime-run", "slime run", control, "admin")]


# --------------------------------------------------------------------------------- router process
def _watch_parent(parent_pid: int) -> None:
    """Fork a tiny watchdog: when `parent_pid` dies, SIGTERM this process (then SIGKILL).

    sglang-router's `start()` holds the GIL while it serves, so a thread cannot do this.
    """
    router_pid = os.getpid()
    if os.fork() != 0:
        return
    try:
        while True:
            time.sleep(0.5)
            if os.getppid() != router_pid:  # the router itself is gone
                os._exit(0)
            if not pid_alive(parent_pid):
                break
        os.kill(router_pid, signal.SIGTERM)
        time.sleep(5)
        os.kill(router_pid, signal.SIGKILL)
    except OSError:
        pass
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """`python -m slime.ray.router --parent-pid P --policy POLICY <sglang-router args>`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    policy, parent_pid, rest = DEFAULT_ROUTER_POLICY, None, []
    i = 0
    while i < len(argv):
        if argv[i] == "--policy":
            policy, i = argv[i + 1], i + 2
        elif argv[i] == "--parent-pid":
            parent_pid, i = int(argv[i + 1]), i + 2
        else:
            rest.append(argv[i])
            i += 1
    from sglang_router.launch_router import launch_router, parse_router_args  # optional dependency (router extra)

    router_args = parse_router_args(rest)
    router_args.policy = policy  # consistent_hashing exists only here, not in the CLI's choices
    apply_keys(router_args, os.environ.get(ENV_API_KEY), os.environ.get(ENV_ADMIN_API_KEY))
    if parent_pid:
        _watch_parent(parent_pid)
    launch_router(router_args)


if __name__ == "__main__":
    main()
