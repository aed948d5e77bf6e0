"""The engine watcher, in two modes.

* Without `--use-fault-tolerance` (`EngineWatcher(router, urls)`): engines that stopped accepting
  connections leave the router. Retried requests (the rollout client retries connection errors and
  5xx, and so does the router) then land on live engines, and the rollout manager drops the dead
  engine from weight sync. Nothing is restarted (the log says so and names the flag).
* With it (`restart=` given; `--rollout-health-check-*`): slime's health monitor. While it is
  resumed (the rollout manager resumes it for generate/eval and pauses it around offload and weight
  sync), every `interval` seconds each engine's `/health_generate` must answer 200 within `timeout`:
  a refused connection (dead), no answer in time (hung: SIGSTOP, a deadlock) or an error status all
  count. Such an engine leaves the router, `restart(url)` kills it, starts a new one at the same
  address and gives it the current weights, and it rejoins the router. Requests lost with it fail
  over (the router's and the client's retries) to the other engines, or wait for the restarted one
  when it is the only one. The router's own `/health` is checked the same way and a dead or hung
  router is replaced by `restart_router()` (same address). Every recovery is recorded in `events`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import httpx

from slime.errors import SlimeError
from slime.ray.router import RouterProcess
from slime.utils.api_keys import key_for

logger = logging.getLogger(__name__)
NOT_RESTARTED = "it is not restarted: run with --use-fault-tolerance to restart dead or hung engines and the router"


def probe(client: httpx.Client, url: str, path: str, timeout: float) -> str | None:
    """None when `url + path` answers 200 within `timeout` s, else why not (dead, hung, unhealthy)."""
    key = key_for(url, path)
    try:
        resp = client.get(
            url + path,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            headers={"Authorization": f"Bearer {key}"} if key else None,
        )
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        return f"dead (connection failed: {type(e).__name__})"  # refused, or reset mid-answer
    except httpx.TimeoutException:
        return f"hung (no answer to {path} within {timeout:g} s)"
    except httpx.HTTPError as e:
        return f"unreachable ({type(e).__name__}: {e})"
    if resp.status_code != 200:
        return f"unhealthy ({path} answered HTTP {resp.status_code})"
    return None


class EngineWatcher:
    """Without `restart`: removes engines that stopped accepting connections from the router.
    Every `interval` seconds each engine's `/health` is probed; `failures` consecutive refused
    connections (the process is gone, not merely busy) remove it from the router and call
    `on_removed(url)`. A slow answer never counts: a busy engine is not a dead one.

    With `restart` (fault tolerance): see the module docstring; `timeout` bounds each health check,
    `first_wait` is the grace period after each `resume()`, and it starts paused.
    """

    def __init__(
        self,
        router: RouterProcess | None,
        engine_urls: Iterable[str],
        *,
        interval: float = 1.0,
        failures: int = 2,
        on_removed: Callable[[str], None] | None = None,
        timeout: float = 5.0,
        first_wait: float = 0.0,
        restart: Callable[[str], str] | None = None,
        restart_router: Callable[[], RouterProcess] | None = None,
    ):
        self.router, self.interval, self.failures, self.on_removed = router, interval, failures, on_removed
        self.timeout, self.first_wait = timeout, first_wait
        self.restart, self.restart_router = restart, restart_router
        self.urls = list(engine_urls)
        self.removed: list[str] = []
        # one per recovery: {"what", "url", "reason", "detected_at", "recovered_s", "ok"}
        self.events: list[dict] = []
        self._strikes = dict.fromkeys(self.urls, 0)
        self._stop = threading.Event()
        self._active = threading.Event()  # cleared while paused
        if restart is None:
            self._active.set()
        self._lock = threading.Lock()  # held by a check (and its recoveries)
        self._resumed_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="engine-watcher", daemon=True)

    def start(self) -> EngineWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._active.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def pause(self) -> None:
        """No checks from now on; returns once a running check (and its recoveries) has finished."""
        self._active.clear()
        with self._lock:
            pass

    def resume(self) -> None:
        self._resumed_at = time.monotonic()
        self._active.set()

    def check_now(self) -> None:
        """One check (and its recoveries) in the caller's thread, paused or not."""
        with httpx.Client(trust_env=False) as client:
            self.check_once(client)

    def check_once(self, client: httpx.Client, *, only_if_active: bool = False) -> None:
        with self._lock:
            if only_if_active and not self._active.is_set():  # paused while this check waited
                return
            if self.restart is not None:
                self._check_and_recover(client)
            else:
                self._check_and_remove(client)

    # ------------------------------------------------------------------ fault tolerance
    def _check_and_recover(self, client: httpx.Client) -> None:
        if self.router is not None and self.restart_router is not None:
            reason = probe(client, self.router.url, "/health", self.timeout)
            if reason is not None:
                self._recover("router", self.router.url, reason, self._replace_router)
        for url in list(self.urls):
            if self._stop.is_set():
                return
            reason = probe(client, url, "/health_generate", self.timeout)
            if reason is not None:
                self._recover("engine", url, reason, lambda u=url: self._replace_engine(u))
        if self.router is not None:  # an engine whose re-registration failed is registered again
            try:
                listed = set(self.router.worker_urls())
                for url in [u for u in self.urls if u not in listed]:
                    logger.warning("engine %s is missing from the router; registering it again", url)
                    self.router.add_worker(url)
            except (httpx.HTTPError, SlimeError) as e:  # the router itself is checked at the next round
                logger.warning("could not check the router's engines: %s", e)

    def _recover(self, what: str, url: str, reason: str, replace: Callable[[], None]) -> None:
        detected = time.monotonic()
        logger.warning("%s %s is %s: restarting it (--use-fault-tolerance)", what, url, reason)
        event = {"what": what, "url": url, "reason": reason, "detected_at": time.time(), "ok": False}
        try:
            replace()
            event["ok"] = True
        except Exception as e:
            logger.exception("restarting %s %s failed; trying again at the next check", what, url)
            event["error"] = f"{type(e).__name__}: {e}"
        event["recovered_s"] = time.monotonic() - detected
        self.events.append(event)
        if event["ok"]:
            logger.warning("%s %s is back after %.1f s", what, url, event["recovered_s"])

    def _replace_engine(self, url: str) -> None:
        if self.router is not None:
            try:
                self.router.remove_worker(url)
            except (httpx.HTTPError, SlimeError) as e:  # a dead router is replaced at the next check
                logger.warning("could not remove %s from the router: %s", url, e)
        new_url = self.restart(url)
        self.urls[self.urls.index(url)] = new_url
        if self.router is not None:
            self.router.add_worker(new_url)

    def _replace_router(self) -> None:
        self.router = self.restart_router()

    # ------------------------------------------------------------------ without fault tolerance
    def _check_and_remove(self, client: httpx.Client) -> None:
        if (
            self.router is not None
            and probe(client, self.router.url, "/health", 10.0) is not None
            and "router" not in self.removed
        ):
            self.removed.append("router")
            logger.error("the router %s does not answer; %s", self.router.url, NOT_RESTARTED)
        for url in list(self.urls):
            try:
                client.get(url + "/health")
                self._strikes[url] = 0
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                self._strikes[url] += 1
            except httpx.HTTPError:  # a timeout: busy, not dead
                continue
            if self._strikes[url] >= self.failures:
                logger.warning(
                    "engine %s stopped accepting connections; removing it from the router (%s)", url, NOT_RESTARTED
                )
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
                self._active.wait()
                if self._stop.is_set():
                    return
                if time.monotonic() - self._resumed_at < self.first_wait:
                    continue
                try:
                    self.check_once(client, only_if_active=True)
                except Exception:
                    logger.exception("engine watcher probe failed")


def start_watcher(
    args,
    router: RouterProcess | None,
    engine_urls: list[str],
    *,
    restart: Callable[[str], str],
    restart_router: Callable[[], RouterProcess],
    on_removed: Callable[[str], None] | None = None,
) -> EngineWatcher | None:
    """The watcher a group of engines gets: with --use-fault-tolerance, slime's health monitor
    (dead or hung engines, and the router, are restarted and put back); otherwise, behind a router,
    one that takes a dead engine out so retried requests go to live ones; else none."""
    if args.use_fault_tolerance:
        return EngineWatcher(
            router,
            engine_urls,
            interval=args.rollout_health_check_interval,
            timeout=args.rollout_health_check_timeout,
            first_wait=args.rollout_health_check_first_wait,
            restart=restart,
            restart_router=restart_router if router else None,
        ).start()
    if router is not None:
        return EngineWatcher(router, engine_urls, on_removed=on_removed).start()
    return None
