"""The engine watcher: engines that stopped accepting connections leave the router.

Retried requests (the rollout client retries connection errors and 5xx, and so does the router)
then land on live engines, and the rollout manager drops the dead engine from weight sync.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

import httpx

from slime.errors import SlimeError
from slime.ray.router import RouterProcess

logger = logging.getLogger(__name__)


class EngineWatcher:
    """Removes engines that stopped accepting connections from the router.

    Every `interval` seconds each engine's `/health` is probed; `failures` consecutive refused
    connections (the process is gone, not merely busy) remove it from the router and call
    `on_removed(url)`. A slow answer never counts: a busy engine is not a dead one.
    """

    def __init__(self, router: RouterProcess, engine_urls: Iterable[str], *, interval: float = 1.0,
                 failures: int = 2, on_removed: Callable[[str], None] | None = None):
        self.router, self.interval, self.failures, self.on_removed = router, interval, failures, on_removed
        self.urls = list(engine_urls)
        self.removed: list[str] = []
        self._strikes = {u: 0 for u in self.urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-watcher", daemon=True)

    def start(self) -> "EngineWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def check_once(self, client: httpx.Client) -> None:
        for url in list(self.urls):
            try:
                client.get(url + "/health")
                self._strikes[url] = 0
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                self._strikes[url] += 1
            except httpx.HTTPError:  # a timeout: busy, not dead
                continue
            if self._strikes[url] >= self.failures:
                logger.warning("engine %s stopped accepting connections; removing it from the router", url)
                try:
                    self.router.remove_worker(url)
                except (httpx.HTTPError, SlimeError) as e:
                    logger.warning("could not remove %s from the router: %s", url, e)
                    continue
                self.urls.remove(url)
                self.removed.append(url)
                if self.on_removed is not None:
                    self.on_removed(url)

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False) as client:
            while not self._stop.wait(self.interval):
                try:
                    self.check_once(client)
                except Exception:  # noqa: BLE001 - the watcher must outlive a bad probe
                    logger.exception("engine watcher probe failed")
