"""A small built-in HTTP dispatcher, used when `sglang-router` is not installed.

    python -m slime.ray.dispatcher --host 127.0.0.1 --port P --worker-urls http://127.0.0.1:A ...

* Requests go round robin over healthy workers; a request with `X-SMG-Routing-Key` always goes
  to the same worker while the membership is unchanged (rendezvous hashing), as sglang-router's
  `consistent_hashing` does.
* A worker that refuses the connection is marked unhealthy and the request is retried on another;
  a background probe of `/health` brings it back when it answers again.
* `/flush_cache` goes to every worker; `/health` answers for the dispatcher itself.
* Membership as sglang-router: `GET /workers`, `POST /workers {"url"}`, `DELETE /workers/{id}`.
* It exits when `--parent-pid` dies.
* Keys as sglang-router's (`$SLIME_API_KEY`, `$SLIME_ADMIN_API_KEY`, never on the command line):
  every endpoint but `/health` needs `Authorization: Bearer <key>` (the admin key, when set, for
  membership and the engines' control endpoints), 401 otherwise; requests go on to the workers
  with the dispatcher's own key. Host/Origin/content-type checks and the body cap are the engine's
  (`slime.engine.guard`): 403, 415, 413.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import logging
import os
import sys
import uuid

import aiohttp
from aiohttp import web

from slime.engine.guard import Policy, Refused, check_headers
from slime.runtime.process import pid_alive
from slime.utils.api_keys import ENV_ADMIN_API_KEY, ENV_API_KEY, is_admin_path
from slime.utils.http_utils import ROUTING_KEY_HEADER

logger = logging.getLogger("slime.dispatcher")
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
MAX_BODY = 256 * 1024**2  # rollout traffic; weight updates go to the engines directly


class Worker:
    def __init__(self, url: str):
        self.id, self.url, self.healthy = str(uuid.uuid4()), url.rstrip("/"), True

    def to_json(self) -> dict:
        return {"id": self.id, "url": self.url, "is_healthy": self.healthy}


class Dispatcher:
    def __init__(
        self,
        worker_urls: list[str],
        health_interval: float = 1.0,
        *,
        host: str = "127.0.0.1",
        api_key: str | None = None,
        admin_api_key: str | None = None,
    ):
        self.policy = Policy.for_server(
            host, api_key=api_key, admin_api_key=admin_api_key, max_body=MAX_BODY, max_weight_body=MAX_BODY
        )
        self.workers: dict[str, Worker] = {}
        for url in worker_urls:
            self.add(url)
        self.health_interval = health_interval
        self.request_timeout: float | None = None  # one forwarded request's limit (None: unbounded)
        self._rr = itertools.count()
        self.session: aiohttp.ClientSession | None = None

    def add(self, url: str) -> Worker:
        for w in self.workers.values():
            if w.url == url.rstrip("/"):
                return w
        w = Worker(url)
        self.workers[w.id] = w
        return w

    def pick(self, routing_key: str | None, exclude: set[str]) -> Worker | None:
        live = [w for w in self.workers.values() if w.healthy and w.id not in exclude]
        if not live:
            return None
        if routing_key:  # rendezvous hashing: the key stays put unless its worker leaves
            return max(live, key=lambda w: hashlib.sha256(f"{routing_key}|{w.url}".encode()).digest())
        return live[next(self._rr) % len(live)]

    def _worker_auth(self, path: str) -> dict[str, str]:
        """The dispatcher's own key for a worker (a client's header is never passed on)."""
        p = self.policy
        key = p.admin_api_key if p.admin_api_key and is_admin_path(path) else p.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    @web.middleware
    async def guard(self, request: web.Request, handler):
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            check_headers(self.policy, request.method, request.path, headers)
        except Refused as e:
            return web.json_response({"error": {"message": str(e)}}, status=e.status)
        return await handler(request)

    # ---- handlers
    async def forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers.get(ROUTING_KEY_HEADER)
        headers = {
            "Content-Type": request.headers.get("Content-Type", "application/json"),
            **self._worker_auth(request.path),
        }
        tried: set[str] = set()
        while True:
            worker = self.pick(key, tried)
            if worker is None:
                return web.json_response({"error": {"message": "no healthy worker"}}, status=503)
            tried.add(worker.id)
            try:
                async with self.session.request(
                    request.method, worker.url + request.path_qs, data=body, headers=headers
                ) as resp:
                    data = await resp.read()
                    out = web.Response(
                        body=data, status=resp.status, content_type=resp.content_type or "application/json"
                    )
                    if "Retry-After" in resp.headers:  # a full engine queue: the client waits, not fails
                        out.headers["Retry-After"] = resp.headers["Retry-After"]
                    return out
            except _CONNECT_ERRORS as e:  # the worker is gone or going: try another one
                logger.warning("worker %s failed (%s); marked unhealthy, retrying elsewhere", worker.url, e)
                worker.healthy = False

    async def flush_cache(self, request: web.Request) -> web.Response:
        async def one(w: Worker):
            try:
                async with self.session.post(w.url + "/flush_cache", headers=self._worker_auth("/flush_cache")) as resp:
                    return w.url, resp.status
            except _CONNECT_ERRORS as e:
                return w.url, f"error: {e}"

        results = dict(await asyncio.gather(*(one(w) for w in list(self.workers.values()))))
        ok = all(v == 200 for v in results.values())
        return web.json_response({"success": ok, "workers": results}, status=200 if ok else 500)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def list_workers(self, request: web.Request) -> web.Response:
        ws = [w.to_json() for w in self.workers.values()]
        return web.json_response({"workers": ws, "total": len(ws)})

    async def add_worker(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            url = body["url"]
            assert isinstance(url, str) and url.startswith("http")
        except Exception:  # noqa: BLE001
            return web.json_response({"error": {"message": 'expected {"url": "http://host:port"}'}}, status=400)
        w = self.add(url)
        logger.info("worker %s added (%s)", w.url, w.id)
        return web.json_response({"status": "accepted", "worker_id": w.id, "url": w.url}, status=202)

    async def remove_worker(self, request: web.Request) -> web.Response:
        w = self.workers.pop(request.match_info["worker_id"], None)
        if w is None:
            return web.json_response({"error": {"message": "no such worker"}}, status=404)
        logger.info("worker %s removed", w.url)
        return web.json_response({"status": "accepted", "worker_id": w.id}, status=202)

    async def _probe(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            for w in list(self.workers.values()):
                if w.healthy:
                    continue
                try:
                    async with self.session.get(w.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            w.healthy = True
                            logger.info("worker %s is healthy again", w.url)
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass

    def app(self, parent_pid: int | None = None) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self.guard])
        app.router.add_get("/health", self.health)
        app.router.add_get("/workers", self.list_workers)
        app.router.add_post("/workers", self.add_worker)
        app.router.add_delete("/workers/{worker_id}", self.remove_worker)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.router.add_route("*", "/{tail:.*}", self.forward)

        async def on_startup(app):
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=10),
                trust_env=False,
            )
            app["tasks"] = [asyncio.create_task(self._probe())]
            if parent_pid:
                app["tasks"].append(asyncio.create_task(_watch_parent(parent_pid)))

        async def on_cleanup(app):
            for t in app["tasks"]:
                t.cancel()
            await self.session.close()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app


async def _watch_parent(pid: int) -> None:
    while pid_alive(pid):
        await asyncio.sleep(0.5)
    logger.warning("parent process %d is gone; exiting", pid)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m slime.ray.dispatcher")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--worker-urls", nargs="*", default=[])
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=None,
        help="Limit on one forwarded request (slime's --sglang-router-request-timeout-secs).",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    d = Dispatcher(
        args.worker_urls,
        host=args.host,
        api_key=os.environ.get(ENV_API_KEY),
        admin_api_key=os.environ.get(ENV_ADMIN_API_KEY),
    )
    d.request_timeout = args.request_timeout_secs
    logger.info("dispatcher on http://%s:%d over %d workers", args.host, args.port, len(d.workers))
    # handler_cancellation: a client that disconnects cancels its forward, which closes the
    # connection to the engine, which then aborts the request
    web.run_app(
        d.app(args.parent_pid), host=args.host, port=args.port, print=None, access_log=None, handler_cancellation=True
    )


if __name__ == "__main__":
    main()
