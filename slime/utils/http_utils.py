"""Async JSON over HTTP for rollout code (slime's `slime.utils.http_utils.post` signature).

One aiohttp session per event loop, with no connection limit (`init_http_client` sets one from the
run's engines), is shared by every call made on that loop; it is closed when the loop shuts down its async generators (asyncio.run does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import random
import socket
import weakref
from typing import Any

import aiohttp

try:  # a declared dependency; an image without it (the GPU check's) falls back to json
    import orjson
except ImportError:  # pragma: no cover - exercised by scripts/gpu_check.sh's test
    orjson = None

from slime.errors import SlimeError
from slime.utils.api_keys import auth_headers

logger = logging.getLogger(__name__)

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, Any]] = (
    weakref.WeakKeyDictionary()
)


class HTTPRequestError(SlimeError):
    """A request that failed; the base of the three kinds below, which callers tell apart by type."""

    def __init__(self, message: str, status: int | None = None, url: str | None = None):
        super().__init__(message)
        self.status = status
        self.url = url


class EngineUnreachable(HTTPRequestError):
    """No answer came back: the connection was refused, reset or dropped (the server is down or died)."""


class EngineTimeout(HTTPRequestError):
    """The server took the connection but did not answer within the time limit (hung or overloaded)."""


class EngineRequestFailed(HTTPRequestError):
    """The server answered with an error status (`status`): a 4xx at once (the request is bad), a 5xx
    once the attempts are used up."""

    def __init__(self, message: str, status: int, url: str | None = None):
        super().__init__(message, status, url)


def server_lost(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the server is gone or broken
    (unreachable, silent past the timeout, or answering 5xx) rather than that the request was bad."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (EngineUnreachable, EngineTimeout)):
            return True
        if isinstance(exc, EngineRequestFailed) and exc.status >= 500:
            return True
        exc = exc.__cause__
    return False


def _failure(method: str, url: str, attempts: int, last: BaseException | None) -> HTTPRequestError:
    """The error for a request whose every attempt failed, typed by how the last attempt failed."""
    message = f"{method} {url} failed after {attempts} attempts: {last}"
    if isinstance(last, EngineRequestFailed):
        return EngineRequestFailed(message, last.status, url)
    if isinstance(last, TimeoutError):  # aiohttp's own timeouts subclass it too
        return EngineTimeout(message, None, url)
    return EngineUnreachable(message, None, url)


async def _session_keeper(session: aiohttp.ClientSession):
    try:
        yield
    finally:
        await session.close()


async def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    entry = _sessions.get(loop)
    if entry is not None and not entry[0].closed:
        return entry[0]
    connector = aiohttp.TCPConnector(
        limit=int(_limits["max_connections"]), limit_per_host=0, ttl_dns_cache=300, force_close=False
    )
    session = aiohttp.ClientSession(
        connector=connector,
        # every attempt is bounded (a hung server must not hang the run); see configure()
        timeout=aiohttp.ClientTimeout(total=_limits["timeout"], sock_connect=30),
        trust_env=False,
    )
    # An async generator that is still suspended is closed by loop.shutdown_asyncgens(), so the
    # session is closed cleanly when the loop ends (no "Unclosed client session" warnings).
    keeper = _session_keeper(session)
    await keeper.__anext__()
    _sessions[loop] = (session, keeper)
    return session


async def close_sessions() -> None:
    """Close this loop's shared session now (optional)."""
    loop = asyncio.get_running_loop()
    entry = _sessions.pop(loop, None)
    if entry is not None:
        await entry[1].aclose()


def _error_message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict) and err.get("message"):
                return str(err["message"])
            for key in ("message", "detail", "error"):
                if body.get(key):
                    return str(body[key])
    except ValueError:
        pass
    return text.strip()[:2000] or f"HTTP {status}"


QUEUE_FULL_WAIT_S = 600.0  # how long a request waits out full engine queues in all
_BACKOFF_MAX_S = 5.0


def _queue_full(status: int, headers: Any, text: str) -> bool:
    """A 503 that says "come back later" (the engine's full queue), not a broken server."""
    return status == 503 and ("Retry-After" in headers or "queue is full" in text)


# Per-process limits of rollout requests, set once from the run's arguments by `configure`:
# one attempt's timeout (--sglang-router-request-timeout-secs), attempts of a `post` by default
# (--rollout-request-max-retries) and the longest wait between attempts (--rollout-request-retry-interval).
# `max_connections` (0: no limit) caps one loop's open connections; `init_http_client` sets it.
_limits: dict[str, float] = {"timeout": 14400.0, "max_retries": 60, "retry_interval": 1.0, "max_connections": 0}
_FIRST_BACKOFF_S = 0.1


def configure(
    *,
    timeout: float | None = None,
    max_retries: int | None = None,
    retry_interval: float | None = None,
    max_connections: int | None = None,
) -> None:
    """Set this process's request limits (sessions made afterwards use the timeout and the
    connection cap)."""
    for key, value in (
        ("timeout", timeout),
        ("max_retries", max_retries),
        ("retry_interval", retry_interval),
        ("max_connections", max_connections),
    ):
        if value is not None:
            _limits[key] = value
    _sessions.clear()  # the next call makes a session with the new limits


def retry_delay(attempt: int, retry_interval: float) -> float:
    """Wait before attempt `attempt + 1`: exponential from 0.1 s, capped at `retry_interval` (a
    restarted engine is found quickly; a long outage is polled every `retry_interval`)."""
    return min(retry_interval, _FIRST_BACKOFF_S * 2 ** (attempt - 1))


async def _request(
    method: str, url: str, payload: Any, max_retries: int, retry_interval: float, headers: dict[str, str] | None = None
) -> Any:
    headers = auth_headers(url, headers)  # the run's key, to the run's own servers only
    last: BaseException | None = None
    attempts = max(1, int(max_retries))
    attempt, waited, backoff = 0, 0.0, 0.05
    while attempt < attempts:
        try:
            session = await _session()
            body_kw = (
                {}
                if payload is None
                else {"data": _encode(payload), "headers": {"Content-Type": "application/json", **(headers or {})}}
            )
            async with session.request(method, url, **{"headers": headers, **body_kw}) as resp:
                body = await resp.read()
                text = body.decode("utf-8", errors="replace") if resp.status >= 400 else ""
                if _queue_full(resp.status, resp.headers, text) and waited < QUEUE_FULL_WAIT_S:
                    # not a failure: wait (backing off) without using up an attempt
                    await asyncio.sleep(backoff)
                    waited, backoff = waited + backoff, min(backoff * 2, _BACKOFF_MAX_S)
                    continue
                if resp.status >= 400:
                    error = EngineRequestFailed(
                        f"{method} {url}: HTTP {resp.status}: {_error_message(resp.status, text)}", resp.status, url
                    )
                    if resp.status < 500:  # the request itself is bad: another attempt would fail alike
                        raise error
                    last = error
                else:
                    return _decode(body)
        except HTTPRequestError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            last = e
        attempt += 1
        if attempt < attempts:
            logger.debug("%s %s failed (%s); retry %d/%d", method, url, last, attempt, attempts - 1)
            await asyncio.sleep(retry_delay(attempt, retry_interval))
    raise _failure(method, url, attempts, last)


def _encode(payload: Any) -> bytes:
    """JSON bytes of a request; orjson (several times faster than json on token-id lists), else json."""
    if orjson is not None:
        try:
            return orjson.dumps(payload)
        except TypeError:  # what orjson refuses (non-string keys, big ints, ...) json may take
            pass
    return json.dumps(payload).encode()


def _decode(body: bytes) -> Any:
    """An answer: JSON (orjson; json for what only it reads, e.g. NaN), the text if it is not JSON,
    {} if empty."""
    if not body:
        return {}
    if orjson is not None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


async def post(
    url: str,
    payload: Any = None,
    max_retries: int | None = None,
    headers: dict[str, str] | None = None,
    *,
    retry_interval: float | None = None,
) -> Any:
    """POST `payload` as JSON (None sends `{}`, as slime does) and return the decoded JSON answer.

    Positional arguments are slime's, in slime's order: `post(url, payload, max_retries, headers)`.
    Connection errors, 5xx answers and attempts that time out (`configure`'s timeout, the run's
    --sglang-router-request-timeout-secs) are retried (`max_retries` attempts in all, default
    --rollout-request-max-retries, waits backing off from 0.1 s up to `retry_interval`, default
    --rollout-request-retry-interval); a 503 for a full engine queue is waited out with backoff (up to
    `QUEUE_FULL_WAIT_S`) without using up an attempt; a 4xx raises `EngineRequestFailed` at once with
    the server's message. Attempts used up raise `EngineUnreachable`, `EngineTimeout` or
    `EngineRequestFailed` (a 5xx) by how the last one failed; all are `HTTPRequestError`s. `headers`
    are sent with every attempt (e.g. `session_headers(session_id)` for router session affinity);
    requests to the run's own servers also carry its key (`slime.utils.api_keys`).
    """
    return await _request(
        "POST",
        url,
        {} if payload is None else payload,
        _limits["max_retries"] if max_retries is None else max_retries,
        _limits["retry_interval"] if retry_interval is None else retry_interval,
        headers,
    )


async def get(
    url: str, max_retries: int = 1, retry_interval: float | None = None, headers: dict[str, str] | None = None
) -> Any:
    """GET `url` and return the decoded JSON answer (slime's `get(url)`; same error rules as `post`)."""
    return await _request(
        "GET", url, None, max_retries, _limits["retry_interval"] if retry_interval is None else retry_interval, headers
    )


def is_port_available(port: int) -> bool:
    """Whether a TCP port can be bound on every interface right now (slime's helper)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            s.listen(1)
            return True
        except (OSError, OverflowError):
            return False


def get_rollout_num_engines(args: Any) -> int:
    """How many engines serve the rollout (slime's helper): the rollout GPUs over the GPUs per
    engine, as the cluster arguments resolved it."""
    return int(args.num_engines)


ROUTING_KEY_HEADER = "X-SMG-Routing-Key"


def session_headers(session_id: str | None) -> dict[str, str] | None:
    """The router's routing-key header for one multi-turn trajectory (None without a session).

    With `--router-policy consistent_hashing` (or `manual`, or the built-in dispatcher) every
    request carrying the same key lands on the same engine, as slime does for multi-turn rollouts:
    `await post(url, payload, headers=session_headers(sample.session_id))`.
    """
    return {ROUTING_KEY_HEADER: str(session_id)} if session_id is not None else None


# ---------------------------------------------------------------------------------------------
# slime's process, address and client helpers

SLIME_HOST_IP_ENV = "SLIME_HOST_IP"  # slime's override of the address a node advertises


def find_available_port(base_port: int) -> int:
    """slime's `find_available_port`: a free port from a random start 100-1000 above `base_port`,
    stepping by 42 (by -43 past 60000) until `is_port_available` says yes."""
    port = base_port + random.randint(100, 1000)
    while not is_port_available(port):
        port = port + 42 if port < 60000 else port - 43
    return port


def get_host_info() -> tuple[str, str]:
    """slime's `get_host_info`: (hostname, the address this node's servers are reached at).

    `SLIME_HOST_IP` set wins, as in slime. Otherwise the address is loopback, not slime's probed
    LAN address, because every server here binds 127.0.0.1: `::1` when `SLIME_PREFER_IPV6` is
    1/true/yes/on (slime's switch), else `127.0.0.1`."""
    hostname = socket.gethostname()
    override = os.getenv(SLIME_HOST_IP_ENV)
    if override:
        return hostname, override
    prefer_ipv6 = os.getenv("SLIME_PREFER_IPV6", "0").lower() in ("1", "true", "yes", "on")
    return hostname, "::1" if prefer_ipv6 else "127.0.0.1"


def terminate_process(process: multiprocessing.Process, timeout: float = 1.0) -> None:
    """slime's `terminate_process`: SIGTERM a live `multiprocessing.Process`, wait up to `timeout`
    seconds, then SIGKILL it if it is still alive, and reap it. A finished process is left as is."""
    if not process.is_alive():
        return
    process.terminate()
    process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join()


def run_router(args: Any) -> int:
    """slime's `run_router`: start sglang-router in this process with `args` (its own router
    arguments, as `sglang_router.launch_router.launch_router` takes them); 0 once it has started,
    1 if it failed to (the error is logged, as in slime). Without sglang-router installed this
    raises SlimeError (runs here start the router themselves, see `slime.ray.router`)."""
    try:
        from sglang_router.launch_router import launch_router  # optional dependency (router extra)
    except ImportError as e:
        raise SlimeError(
            f"run_router needs the sglang-router package (pip install sglang-router); it could not be imported: {e}"
        ) from e
    try:
        return 0 if launch_router(args) is not None else 1
    except Exception as e:  # noqa: BLE001 - slime reports any failure to start as exit code 1, logged
        logger.info("sglang-router did not start: %s", e)
        return 1


def init_http_client(args: Any) -> None:
    """slime's `init_http_client`: cap the rollout client's open connections at
    `--sglang-server-concurrency` times the engine count (`get_rollout_num_engines`); nothing with
    no engines. Sessions made afterwards use the cap (`configure(max_connections=...)`); timeouts
    and retries stay as `configure` set them. slime's `--use-distributed-post` is not read: requests
    are posted from the rollout process here."""
    num_engines = get_rollout_num_engines(args)
    if num_engines <= 0:
        return
    configure(max_connections=int(args.sglang_server_concurrency) * num_engines)
