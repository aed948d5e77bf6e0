"""HTTP plumbing of the engine server: JSON in and out, and one way to answer a bad request.

Every route is registered with `route(app, path, handler)`: the JSON body is read and checked
once here, the handler gets it as a dict (or nothing, for GET routes), and a `BadRequest` raised
anywhere in the handler answers HTTP 400 with SGLang's error shape naming the problem. A handler
returns the answer (a dict, 200) or a ready `Response` (another status).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request  # Request at module level: FastAPI resolves endpoint annotations here
from fastapi.responses import Response

from slime.engine.sampling import BadRequest

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

    loads = orjson.loads
except ImportError:  # pragma: no cover - orjson comes with the engine's dependencies
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    def loads(data: bytes | bytearray | memoryview | str) -> Any:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def error_body(msg: str) -> dict:
    return {"error": {"message": msg}, "success": False, "message": msg}


# the `type` of an OpenAI-shaped error by HTTP status (the openai client's exception class names)
OPENAI_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    413: "BadRequestError",
    415: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def openai_error_body(msg: str, status: int = 400, param: str | None = None) -> dict:
    """SGLang's error answer on its OpenAI-compatible routes (the openai client reads `message`)."""
    return {
        "object": "error",
        "message": msg,
        "type": OPENAI_ERROR_TYPES.get(status, "APIError"),
        "param": param,
        "code": status,
    }


def json_response(obj: Any = None, status: int = 200) -> Response:
    return Response(content=dumps(obj if obj is not None else {}), status_code=status, media_type="application/json")


def error_response(msg: str, status: int = 400) -> Response:
    return json_response(error_body(msg), status)


def parse_json(raw: bytes, *, allow_empty: bool) -> Any:
    """The body's JSON value ({} for an empty body where allowed); BadRequest when it is not JSON."""
    if not raw.strip():
        if allow_empty:
            return {}
        raise BadRequest("empty request body; expected a JSON object")
    try:
        return loads(raw)
    except ValueError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None


def json_object(raw: bytes, *, allow_empty: bool) -> dict:
    body = parse_json(raw, allow_empty=allow_empty)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


Answer = Any  # a JSON-able value (HTTP 200) or a Response


def route(
    app: FastAPI,
    paths: str | tuple[str, ...],
    handler: Callable[..., Awaitable[Answer]],
    *,
    methods: tuple[str, ...] = ("POST",),
    body: bool = True,
    allow_empty: bool = True,
) -> None:
    """Serve `handler` at `paths`. With `body`, it is called with the request's JSON object."""

    async def endpoint(request: Request) -> Response:
        try:
            if body:
                answer = await handler(json_object(await request.body(), allow_empty=allow_empty))
            else:
                answer = await handler()
        except BadRequest as e:
            return error_response(str(e))
        return answer if isinstance(answer, Response) else json_response(answer)

    for path in (paths,) if isinstance(paths, str) else paths:
        app.add_api_route(path, endpoint, methods=list(methods))


def generate_ahead_of(app, handle: Callable[[bytes], Awaitable[tuple[int, Any]]]):
    """`app` with POST /generate answered by `handle(raw body) -> (status, answer)` in a plain
    ASGI handler, ahead of FastAPI's middleware and routing: a rollout sends hundreds of requests
    at once, and FastAPI's per-request layers were more than half of taking one in (512
    requests: 0.30 s through FastAPI, 0.12 s here). A client that disconnects cancels `handle`
    (which aborts its requests): nobody is left to read the answer."""
    json_headers = [(b"content-type", b"application/json")]

    async def asgi(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/generate" or scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        answered = await until_disconnect(handle(b"".join(chunks)), receive)
        if answered is None:
            return
        status, answer = answered
        body = dumps(answer)
        headers = json_headers + [(b"content-length", str(len(body)).encode())]
        if status == 503:
            headers.append((b"retry-after", b"1"))  # a full queue: the client comes back later
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return asgi


async def until_disconnect(work: Awaitable[Any], receive) -> Any:
    """`work`'s result, or None (with `work` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
