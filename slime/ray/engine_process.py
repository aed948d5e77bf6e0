"""Engine server processes (built-in or SGLang): start, wait until healthy, stop.

    with EngineProcess.start("/path/to/model", num_threads=1) as engine:   # the built-in engine
        engine.wait_until_healthy()
        EngineClient(engine.url).generate({...})

A built-in server gets `--parent-pid <this process>` and an SGLang server a parent-death signal,
so neither outlives the process that launched it; `atexit` stops any still running.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import httpx

from slime.errors import SlimeError
from slime.runtime.mkl_vendor import preload_env
from slime.runtime.threads import thread_env
from slime.utils.misc import HUB_ENV
from slime.utils.net import free_port

# The directory holding the `slime` package: child processes import this very copy of it.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class EngineLaunchError(SlimeError):
    """The engine server exited or did not become healthy; the message has its log's tail."""


def _tail(path: Path | None, n_lines: int = 40) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 16384))
        data = f.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-n_lines:])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child that imports `slime` from the same place (with
    `HUB_ENV` unless this environment says otherwise: the child reads it at its start)."""
    env = {**HUB_ENV, **os.environ}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def redacted(cmd: list[str]) -> list[str]:
    """`cmd` with the values of key flags hidden (for logs)."""
    return ["***" if i and cmd[i - 1] in ("--api-key", "--admin-api-key") else tok for i, tok in enumerate(cmd)]


_live: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for p in list(_live):
        try:
            p.stop(grace=3)
        except Exception:  # noqa: BLE001
            pass


class EngineProcess:
    def __init__(self, proc: subprocess.Popen, url: str, host: str, port: int, log_path: Path, log_file):
        self.proc = proc
        self.url = url
        self.host = host
        self.port = port
        self.log_path = log_path
        self._log_file = log_file
        self._stopped = False
        _live.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def spawn(
        cls,
        cmd: list[str],
        host: str,
        port: int,
        log_path: str | os.PathLike,
        env: dict[str, str],
        preexec_fn: Callable[[], None] | None = None,
    ) -> EngineProcess:
        """Run `cmd` (a server listening on host:port) with its output appended to `log_path`."""
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")
        log_file.write(("$ " + " ".join(redacted(cmd)) + "\n").encode())
        log_file.flush()
        try:
            proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=preexec_fn
            )
        except OSError as e:
            log_file.close()
            raise EngineLaunchError(f"cannot start the engine server ({cmd[0]}): {e}") from e
        url_host = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
        return cls(proc, f"http://{url_host}:{port}", host, port, log_path, log_file)

    @classmethod
    def start(
        cls,
        model_path: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        num_threads: int = 1,
        extra_args: list[str] | None = None,
        log_path: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
        mkl_vendor_shim: bool = True,
    ) -> EngineProcess:
        """Launch the built-in engine, `python -m slime.engine.server` (returns at once; see
        `wait_until_healthy`). `mkl_vendor_shim`: preload `slime.runtime.mkl_vendor`'s shim where it
        applies (built on this node, which is the engine's)."""
        if port is None:
            port = free_port(host)
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix=f"slime-engine-{port}-", suffix=".log")
            os.close(fd)
        cmd = [
            sys.executable,
            "-m",
            "slime.engine.server",
            "--model-path",
            str(model_path),
            "--host",
            host,
            "--port",
            str(port),
            "--num-threads",
            str(num_threads),
            "--parent-pid",
            str(os.getpid()),
            *(extra_args or []),
        ]
        if not mkl_vendor_shim:
            cmd.append("--no-mkl-vendor-shim")
        extra_env = {**thread_env(num_threads), **preload_env(mkl_vendor_shim), **(env or {})}
        return cls.spawn(cmd, host, port, log_path, child_env(extra_env))

    def wait_until_healthy(self, timeout: float = 120.0, interval: float = 0.1) -> EngineProcess:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise EngineLaunchError(
                        f"engine server (pid {self.pid}, {self.url}) exited with code {code} before it "
                        f"became healthy; last lines of {self.log_path}:\n{_tail(self.log_path)}"
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineLaunchError(
                        f"engine server (pid {self.pid}, {self.url}) not healthy after {timeout:.0f}s; "
                        f"last lines of {self.log_path}:\n{_tail(self.log_path)}"
                    )
                time.sleep(interval)

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds. Safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
                except ProcessLookupError:
                    pass
            else:
                self.proc.wait()
        finally:
            try:
                self._log_file.close()
            except Exception:  # noqa: BLE001
                pass
            _live.discard(self)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_alive() else f"exited({self.proc.returncode})"
        return f"EngineProcess(pid={self.pid}, url={self.url!r}, {state})"
