"""Request errors are typed by how the request failed, and the rollout manager tells a lost engine
from a bad request by type: real servers on 127.0.0.1 that refuse, hang, drop or answer with an error."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.engine import client as engine_client
from slime.errors import SlimeError
from slime.ray.rollout import RolloutFailed, check_failed_samples, rollout_lost_server
from slime.rollout.generation import _mark_failed
from slime.utils import http_utils
from slime.utils.http_utils import (
    EngineRequestFailed,
    EngineTimeout,
    EngineUnreachable,
    HTTPRequestError,
    post,
    server_lost,
)
from slime.utils.types import Sample


# ------------------------------------------------------------------------------------ servers
def _refusing_port() -> int:
    """A port nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Tcp:
    """Accepts connections and either never answers (`close=False`: a hung server) or closes them
    at once (`close=True`: a server that dies mid-request)."""

    def __init__(self, close: bool):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.close_at_once, self.conns = close, []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            if self.close_at_once:
                c.close()
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


class _Status:
    """An HTTP server answering every request with `status` and a JSON error message."""

    def __init__(self, status: int):
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"error": {"message": "no good"}}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast_limits():
    saved = dict(http_utils._limits)
    http_utils.configure(timeout=0.3, max_retries=2, retry_interval=0.05)
    saved_engine = engine_client.DEFAULT_TIMEOUT_S
    engine_client.set_default_timeout(0.3)
    yield
    http_utils.configure(**saved)
    engine_client.set_default_timeout(saved_engine)


def _post(url: str) -> BaseException:
    async def go():
        try:
            await post(url, {"x": 1})
        finally:
            await http_utils.close_sessions()

    with pytest.raises(HTTPRequestError) as e:
        asyncio.run(go())
    return e.value


# ------------------------------------------------------------------------- http_utils.post
def test_refused_connection_is_unreachable(fast_limits):
    e = _post(f"http://127.0.0.1:{_refusing_port()}/generate")
    assert type(e) is EngineUnreachable and isinstance(e, SlimeError)
    assert e.status is None and "failed after 2 attempts" in str(e) and server_lost(e)


def test_dropped_connection_is_unreachable(fast_limits):
    srv = _Tcp(close=True)
    try:
        e = _post(f"http://127.0.0.1:{srv.port}/generate")
        assert type(e) is EngineUnreachable and server_lost(e)
    finally:
        srv.close()


def test_silent_server_is_a_timeout(fast_limits):
    srv = _Tcp(close=False)
    try:
        e = _post(f"http://127.0.0.1:{srv.port}/generate")
        assert type(e) is EngineTimeout and e.status is None and server_lost(e)
        assert len(srv.conns) == 2  # both attempts went out
    finally:
        srv.close()


def test_5xx_is_retried_then_request_failed_with_its_status(fast_limits):
    srv = _Status(500)
    try:
        e = _post(f"http://127.0.0.1:{srv.port}/generate")
        assert type(e) is EngineRequestFailed and e.status == 500 and server_lost(e)
        assert "no good" in str(e) and srv.requests == 2
    finally:
        srv.close()


def test_4xx_fails_at_once_and_is_not_a_lost_server(fast_limits):
    srv = _Status(400)
    try:
        url = f"http://127.0.0.1:{srv.port}/generate"
        e = _post(url)
        assert type(e) is EngineRequestFailed and e.status == 400 and e.url == url
        assert not server_lost(e) and srv.requests == 1
    finally:
        srv.close()


# ------------------------------------------------------------------------- engine client
def test_engine_client_errors_are_typed_alike(fast_limits):
    with pytest.raises(EngineUnreachable):
        engine_client.client_for(f"http://127.0.0.1:{_refusing_port()}").flush_cache()
    silent = _Tcp(close=False)
    failing = _Status(503)
    try:
        with pytest.raises(EngineTimeout):
            engine_client.client_for(f"http://127.0.0.1:{silent.port}").flush_cache()
        with pytest.raises(EngineRequestFailed) as e:
            engine_client.client_for(f"http://127.0.0.1:{failing.port}").flush_cache()
        assert e.value.status == 503 and server_lost(e.value)
    finally:
        silent.close()
        failing.close()


# ------------------------------------------------------------------- the rollout's verdict
def test_server_lost_follows_the_cause_chain():
    lost = EngineUnreachable("down", None, "http://x")
    try:
        raise RuntimeError("the hook gave up") from lost
    except RuntimeError as e:
        assert server_lost(e)
    assert not server_lost(ValueError("Cannot connect: failed after 3 attempts"))  # text is not a type


def _failed_groups(error: BaseException, where: str = "generate", generating: bool = True) -> list[list[Sample]]:
    s = Sample(index=0)
    _mark_failed(s, where, error, generating=generating)
    return [[s]]


@pytest.mark.parametrize(
    ("error", "generating", "lost"),
    [
        (EngineUnreachable("down", None, "u"), True, True),
        (EngineTimeout("hung", None, "u"), True, True),
        (EngineRequestFailed("HTTP 502", 502, "u"), True, True),
        (EngineRequestFailed("HTTP 400", 400, "u"), True, False),
        (ValueError("Cannot connect, failed after 3 attempts"), True, False),
        (EngineUnreachable("reward service down", None, "u"), False, False),  # a reward, not an engine
    ],
)
def test_rollout_failure_says_whether_a_server_was_lost(error, generating, lost):
    with pytest.raises(RolloutFailed) as e:
        check_failed_samples(_failed_groups(error, generating=generating), 0, 0.5)
    assert e.value.server_lost is lost and rollout_lost_server(e.value) is lost
    assert isinstance(e.value, SlimeError) and type(error).__name__ in str(e.value)


def test_an_error_raised_by_the_rollout_function_itself_is_classified_by_type():
    assert rollout_lost_server(EngineTimeout("hung", None, "u"))
    assert not rollout_lost_server(SlimeError("--rollout-function-path raised: failed after 3 attempts"))
