"""Who may call the engine server, and how much they may send: a plain ASGI layer in front of
every route (the /generate fast path included), checked from the request's headers before any
body is read.

* Host must be a loopback name or the bound host (DNS rebinding: a web page's own name pointed
  at 127.0.0.1), else 403; a present Origin must be the server's own, else 403 (browsers send
  Origin on every cross-site POST, no-CORS ones included).
* A POST body must be `application/json`, else 415, and text/plain and form types are refused
  even with an empty body: they are all a cross-site no-CORS POST can send.
* Keys (`slime.utils.api_keys.required_key`, SGLang's rules): a missing or wrong
  `Authorization: Bearer <key>` answers 401.
* Bodies over the cap answer 413 before more than the cap is read; /update_weights_from_tensor
  has a cap of its own (a full state dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.engine.http import dumps, error_body, openai_error_body
from slime.utils.api_keys import bearer_matches, required_key

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WEIGHT_BODY_PATHS = frozenset({"/update_weights_from_tensor"})
# what a cross-site page may POST without a CORS preflight: refused even with an empty body
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
_ANY_HOST = ("0.0.0.0", "::", "")


@dataclass
class Policy:
    api_key: str | None
    admin_api_key: str | None
    max_body: int  # bytes
    max_weight_body: int  # bytes, for WEIGHT_BODY_PATHS
    hosts: frozenset[str] = field(default=LOOPBACK_NAMES)  # empty: any host (bound to every interface)

    @classmethod
    def for_server(cls, bind_host: str, **kw: Any) -> Policy:
        hosts = frozenset() if bind_host in _ANY_HOST else LOOPBACK_NAMES | {bind_host.strip("[]").lower()}
        return cls(hosts=hosts, **kw)


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _host_name(host: str) -> str:
    """'[::1]:8000' -> '::1', 'Localhost:80' -> 'localhost'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def check_headers(policy: Policy, method: str, path: str, headers: dict[str, str]) -> None:
    """Refused(status, why) unless the request may go on (its body not read yet)."""
    host = headers.get("host")
    if policy.hosts and host is not None and _host_name(host) not in policy.hosts:
        raise Refused(403, f"Host {host!r} is not this server")
    origin = headers.get("origin")
    if origin is not None and origin.lower().split("://", 1)[-1].rstrip("/") != (host or "").lower():
        raise Refused(403, f"cross-origin request from {origin!r} refused")
    key = required_key(path, policy.api_key, policy.admin_api_key)
    if key is not None and not bearer_matches(headers.get("authorization"), key):
        raise Refused(401, "Unauthorized: missing or wrong 'Authorization: Bearer <key>'")
    if method in ("POST", "PUT", "PATCH"):
        ctype = headers.get("content-type")
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        media = (ctype or "").split(";", 1)[0].strip().lower()
        if media in SIMPLE_TYPES or (has_body and media != "application/json"):
            raise Refused(415, f"request bodies must be application/json, got {ctype!r}")
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > body_cap(policy, path)):
        raise Refused(
            413, f"request body of {length} bytes is over this endpoint's cap of {body_cap(policy, path)} bytes"
        )


def body_cap(policy: Policy, path: str) -> int:
    return policy.max_weight_body if path in WEIGHT_BODY_PATHS else policy.max_body


async def _answer(send, path: str, status: int, message: str) -> None:
    # the OpenAI-compatible routes answer every error in their own shape
    body = dumps(openai_error_body(message, status) if path.startswith("/v1/") else error_body(message))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _read_capped(receive, cap: int) -> bytes | None:
    """The whole body, or None when the client left; Refused(413) once it grows past `cap`."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise Refused(413, f"request body is over this endpoint's cap of {cap} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def guarded(app, policy: Policy):
    """`app` behind the checks above. The body is read here (capped) and handed on in one
    message; later `receive` calls reach the client's connection (a disconnect is still seen)."""

    async def asgi(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            check_headers(policy, scope["method"], scope["path"], headers)
            if scope["method"] in ("GET", "HEAD"):
                return await app(scope, receive, send)
            body = await _read_capped(receive, body_cap(policy, scope["path"]))
        except Refused as e:
            return await _answer(send, scope["path"], e.status, str(e))
        if body is None:
            return
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, replay, send)

    return asgi
