"""The OpenAI-compatible routes: GET /v1/models (and /v1/models/{id}), POST /v1/completions and
POST /v1/chat/completions (`slime.engine.openai_api`; user docs: docs/openai-api.md).

Served as a plain ASGI layer ahead of FastAPI, like /generate (`http.generate_ahead_of`): a
streaming answer is sent chunk by chunk as the tokens come, and a client that disconnects has its
requests aborted (watched on the connection, not found out at the next write). Behind
`slime.engine.guard` like every route: the API key, hosts and body caps apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slime.engine.http import dumps, loads, openai_error_body, until_disconnect
from slime.engine.openai_api.protocol import (
    APIError,
    Context,
    Plan,
    model_sampling_defaults,
    parse_chat,
    parse_completion,
)
from slime.engine.openai_api.responses import chat_response, completion_response
from slime.engine.openai_api.stream import ChunkStream
from slime.engine.routes.generation import INLINE_PARSE_BYTES
from slime.engine.state import EngineState, QueueFull

logger = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class OpenAIRoutes:
    def __init__(self, state: EngineState):
        self.state = state
        args = state.args
        self.ctx = Context(
            runner=state.runner,
            max_total_tokens=state.max_total_tokens,
            max_batch=args.max_batch_request_size,
            model_name=args.served_model_name or state.model_path,
            tool_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            chat_defaults=model_sampling_defaults(state.model_path),
        )
        self.created = int(time.time())
        self.parsers: dict[str, Callable[[Any, Context], Plan]] = {
            "/v1/completions": parse_completion,
            "/v1/chat/completions": parse_chat,
        }

    def model_card(self) -> dict:
        return {
            "id": self.ctx.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "slime",
            "root": self.state.model_path,
            "max_model_len": self.state.runner.context_length,
        }

    async def __call__(self, scope, receive, send) -> bool:
        """Answer the request if it is one of these routes; False (nothing sent) otherwise."""
        path, method = scope["path"], scope["method"]
        if path in self.parsers and method == "POST":
            await self.generate(path, receive, send)
        elif path == "/v1/models" and method == "GET":
            await _send_json(send, 200, {"object": "list", "data": [self.model_card()]})
        elif path.startswith("/v1/models/") and method == "GET":
            name = path[len("/v1/models/") :]
            if name == self.ctx.model_name:
                await _send_json(send, 200, self.model_card())
            else:
                await _send_json(send, 404, openai_error_body(f"the model {name!r} does not exist", 404, "model"))
        else:
            return False
        return True

    # ---------------------------------------------------------------- generation
    async def generate(self, path: str, receive, send) -> None:
        raw = await _read_body(receive)
        if raw is None:  # the client left
            return
        try:
            plan = await self._plan(path, raw)
        except APIError as e:
            return await _send_json(send, e.status, e.body())
        except Exception as e:  # a body no check foresaw: answered, and logged to be fixed
            logger.exception("%s: the request could not be read", path)
            return await _send_json(send, 500, openai_error_body(f"{type(e).__name__}: {e}", 500))
        if plan.stream:
            return await self._stream(plan, receive, send)
        answered = await until_disconnect(self._answer(plan), receive)
        if answered is not None:
            await _send_json(send, *answered)

    async def _plan(self, path: str, raw: bytes) -> Plan:
        """The validated request; tokenizing a large one runs off the event loop (as /generate's)."""

        def parse() -> Plan:
            try:
                body = loads(raw)
            except ValueError as e:
                raise APIError(f"request body is not valid JSON: {e}") from None
            return self.parsers[path](body, self.ctx)

        if len(raw) <= INLINE_PARSE_BYTES:
            return parse()
        return await asyncio.get_running_loop().run_in_executor(self.state.parse_pool, parse)

    async def _answer(self, plan: Plan) -> tuple[int, dict]:
        try:
            results = await self.state.run(plan.reqs)
        except QueueFull as e:
            return 503, openai_error_body(str(e), 503)
        except Exception as e:  # noqa: BLE001 - an engine failure; answered as 500
            return 500, openai_error_body(f"generation failed: {type(e).__name__}: {e}", 500)
        build = completion_response if plan.kind == "completion" else chat_response
        return 200, build(plan, results, self.state.runner.tokenizer)

    async def _stream(self, plan: Plan, receive, send) -> None:
        stream = ChunkStream(self.state, plan)
        try:
            stream.start()
        except QueueFull as e:
            return await _send_json(send, 503, openai_error_body(str(e), 503))
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        done = await until_disconnect(_pump(stream, send), receive)
        if done is None:
            logger.debug("a streaming client left; its requests are aborted")


async def _pump(stream: ChunkStream, send) -> bool:
    """Send every chunk as a server-sent event, then `[DONE]`; a failure mid-way is sent as an
    error event (the openai client raises it)."""

    async def event(data: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})

    try:
        async with contextlib.aclosing(stream.chunks()) as chunks:
            async for chunk in chunks:
                await event(b"data: " + dumps(chunk) + b"\n\n")
    except Exception as e:  # noqa: BLE001 - an engine failure after the answer started
        error = openai_error_body(f"generation failed: {type(e).__name__}: {e}", 500)
        await event(b"data: " + dumps({"error": error}) + b"\n\n")
    await event(b"data: [DONE]\n\n", more=False)
    return True


async def _read_body(receive) -> bytes | None:
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _send_json(send, status: int, body: Any) -> None:
    data = dumps(body)
    headers = [*_JSON, (b"content-length", str(len(data)).encode())]
    if status == 503:
        headers.append((b"retry-after", b"1"))  # a full queue: the client comes back later
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def openai_ahead_of(app, state: EngineState) -> Callable[..., Awaitable[None]]:
    """`app` with the OpenAI-compatible routes answered first (everything else goes on to `app`)."""
    routes = OpenAIRoutes(state)

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and await routes(scope, receive, send):
            return
        await app(scope, receive, send)

    return asgi
