"""The router in front of several engines: the real `sglang-router` (Rust, from PyPI).

Launched on 127.0.0.1 with its metrics port on 127.0.0.1 too (both default to 0.0.0.0).
A later issue adds the policy flag, runtime membership and a built-in fallback.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import httpx

from slime.errors import SlimeError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RouterProcess:
    host: str
    port: int
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_router(args: Namespace, worker_urls: list[str], policy: str = "round_robin") -> RouterProcess:
    try:
        import sglang_router  # noqa: F401
    except ImportError as e:
        raise SlimeError(
            "several engines need a router: `pip install sglang-router` (or use --rollout-num-gpus equal to "
            "--rollout-num-gpus-per-engine for one engine)"
        ) from e
    host, port, metrics_port = "127.0.0.1", _free_port(), _free_port()
    log = open(Path(args.run_dir) / "logs" / "router.log", "ab")
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--prometheus-host", host, "--prometheus-port", str(metrics_port), "--policy", policy,
           "--model-path", args.hf_checkpoint, "--worker-urls", *worker_urls]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    router = RouterProcess(host, port, proc)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SlimeError(f"sglang-router exited with code {proc.returncode}; see {log.name}")
        try:
            if httpx.get(router.url + "/health", timeout=1).status_code == 200:
                return router
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    router.stop()
    raise SlimeError(f"sglang-router did not become healthy in 60 s; see {log.name}")
