"""Serve an `aiohttp.web.Application` from a daemon thread with its own event loop (slime's
`slime.agent.aiohttp_threaded.run_app_in_thread`): the adapter answers the agent's HTTP calls
while the rollout's loop runs the agents."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_log import AccessLogger


class FilteredAccessLogger(AccessLogger):
    """Access log of the unusual requests only: errors and answers slower than 120 s."""

    SLOW_THRESHOLD_SEC = 120.0

    def log(self, request, response, time):
        if request.method == "HEAD" or (response.status < 400 and time <= self.SLOW_THRESHOLD_SEC):
            return
        super().log(request, response, time)


@dataclass
class AppHandle:
    host: str
    port: int
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    runner: web.AppRunner

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Close the server and end the thread (idempotent)."""
        if not self.thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - best effort: the loop is stopped below either way
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def run_app_in_thread(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    thread_name: str = "aiohttp-app",
    start_timeout_sec: float = 15.0,
    runner_kwargs: dict[str, Any] | None = None,
) -> AppHandle:
    """Start `app` on a daemon thread and return once it listens (`port=0`: a free port, read it
    from the handle). Default host 127.0.0.1: the agents run on this machine (slime binds
    0.0.0.0; pass `host=` for agents elsewhere)."""
    started = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(app, access_log_class=FilteredAccessLogger, **(runner_kwargs or {}))
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            box.update(loop=loop, runner=runner, port=site._server.sockets[0].getsockname()[1])  # type: ignore
        except BaseException as e:  # noqa: BLE001 - handed to the starting thread, which raises it
            box["error"] = e
            started.set()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    thread = threading.Thread(target=serve, name=thread_name, daemon=True)
    thread.start()
    if not started.wait(timeout=start_timeout_sec):
        raise TimeoutError(f"{thread_name}: the server did not start within {start_timeout_sec} s")
    if "error" in box:
        raise box["error"]
    return AppHandle(host=host, port=int(box["port"]), thread=thread, loop=box["loop"], runner=box["runner"])
