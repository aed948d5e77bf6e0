"""What the OpenAI and Anthropic adapters share: sessions, the one-turn pipeline, the engine call.

A protocol adapter subclasses `BaseAdapter` and supplies the wire hooks (`_register_routes`,
`_session_id`, `_translate`, `_build_reply`, `_respond`, `_error`) and a few class attributes
(`log_prefix`, `max_token_keys`, `stop_keys`). One turn:

    request -> session id -> turn cap (429) -> chat messages + tools -> prompt token ids
            -> context budget (the API's own 400) -> engine /generate (input_ids, return_logprob)
            -> parse the text (tool calls, reasoning) -> answer the client -> record the turn

Prompt token ids: the request is rendered with the served model's chat template, except that an
assistant message the agent replays unchanged (same history before it, same content) is not
re-rendered: its turn's recorded prompt and output ids are spliced in and only what follows it is
rendered. So a conversation's prompt extends the previous turn's tokens exactly, the whole session
trains as one sample, and nothing the model produced is re-tokenised. (Only for a turn that ended on
a special token, e.g. EOS; a turn cut by length or a stop string is rendered from text, and the
trajectory starts a new segment if the ids differ.)

The engine is called with the run's engine key (`engine_api_key=`, else the key registered for the
engine's address in `slime.utils.api_keys`); the agent authenticates to the adapter with its
session id only and never sees the engine key.

Unknown session ids are served as slime does: the first request of a session id that was never
opened creates the session on the fly (no sampling defaults, no context budget) and its turns are
recorded under that id; they become samples only if someone calls `finish_session` with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from slime.agent.parsing import parse_model_output
from slime.agent.trajectory import TrajectoryManager, TurnRecord
from slime.engine.chat import flatten_content, render_chat, tool_call_dict
from slime.engine.parsing import ParsedModelOutput, check_parser_names
from slime.utils.api_keys import auth_headers

__all__ = [
    "AdapterError",
    "BaseAdapter",
    "Reply",
    "Session",
    "TurnRecord",
    "flatten_content",
    "manager_finish_reason",
    "sid_from_bearer",
    "sid_from_body",
    "tool_call_dict",
]


@dataclasses.dataclass
class Session:
    """Per-session adapter state (the turns themselves live in the shared TrajectoryManager)."""

    sampling_defaults: dict = dataclasses.field(default_factory=dict)
    max_context_tokens: int = 0


@dataclasses.dataclass
class Reply:
    """An adapter's `_build_reply`: the message recorded in the trajectory, and the wire form."""

    manager_message: dict
    finish_reason: str
    wire: Any


class AdapterError(Exception):
    """An error answered to the client in its API's own error shape."""

    def __init__(self, status: int, kind: str, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.code, self.param = status, kind, message, code, param


def manager_finish_reason(tool_uses: list[dict], raw_finish: str) -> str:
    return "tool_calls" if tool_uses else (raw_finish or "stop")


def sid_from_bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def sid_from_body(body: dict | None) -> str | None:
    """OpenAI body hints: `metadata.session_id`, else `user`."""
    if not isinstance(body, dict):
        return None
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id"):
        return str(metadata["session_id"])
    if body.get("user"):
        return str(body["user"])
    return None


async def _json_body(request: web.Request) -> dict:
    try:
        body = json.loads(await request.read() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(400, "invalid_request_error", f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise AdapterError(400, "invalid_request_error", "the request body must be a JSON object")
    return body


class BaseAdapter:
    """Session lifecycle plus the shared one-turn pipeline; see the module docstring."""

    logger: logging.Logger = logging.getLogger(__name__)
    log_prefix: str = "adapter"
    max_token_keys: tuple[str, ...] = ()
    stop_keys: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        tokenizer,
        sglang_url: str,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        max_turns_per_sid: int | None = None,
        engine_api_key: str | None = None,
        served_model_name: str = "slime-actor",
        chat_template_kwargs: dict | None = None,
        debug_callback: Callable[..., None] | None = None,
    ) -> None:
        check_parser_names(tool_parser, reasoning_parser)
        if max_turns_per_sid is not None and max_turns_per_sid < 1:
            raise ValueError(f"max_turns_per_sid must be >= 1 or None, got {max_turns_per_sid}")
        self.tokenizer = tokenizer
        self.sglang_url = sglang_url.rstrip("/")
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.max_turns_per_sid = max_turns_per_sid
        self.engine_api_key = engine_api_key
        self.served_model_name = served_model_name
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.debug_callback = debug_callback
        self.store: dict[str, Session] = {}
        self.inflight: dict[str, set[asyncio.Task]] = {}
        self.closed: set[str] = set()
        self._sid_turn_count: dict[str, int] = {}
        self._special_ids = set(tokenizer.all_special_ids)
        self.manager = TrajectoryManager()
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_get("/healthz", self._health)
        self.app.router.add_get("/v1/models", self._models)
        self._register_routes(self.app)

    # -- wire hooks -------------------------------------------------------------------------
    def _register_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _session_id(self, request: web.Request, body: dict) -> str:
        raise NotImplementedError

    def _preprocess_body(self, body: dict) -> None:
        """Change the parsed body in place before anything else (default: nothing)."""

    def _translate(self, body: dict) -> tuple[list[dict], list[dict] | None]:
        raise NotImplementedError

    def _build_reply(self, parsed: ParsedModelOutput, raw_finish: str) -> Reply:
        raise NotImplementedError

    async def _respond(
        self, request: web.Request, body: dict, reply: Reply, in_tok: int, out_tok: int, stream: bool
    ) -> web.StreamResponse:
        raise NotImplementedError

    def _error(self, err: AdapterError) -> web.Response:
        raise NotImplementedError

    # -- session lifecycle ------------------------------------------------------------------
    def open_session(self, sid: str, *, sampling_defaults: dict | None = None, max_context_tokens: int = 0) -> None:
        """Register a session; its id is what the agent sends as its API key."""
        if sid in self.store or sid in self.closed:
            raise ValueError(f"session_id {sid!r} already exists; session ids must be unique per agent run")
        self.store[sid] = Session(dict(sampling_defaults or {}), int(max_context_tokens or 0))

    async def shutdown_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        """Refuse further requests of `sid` (503) and wait for its in-flight turns (cancelled after
        `wait_timeout`)."""
        self.closed.add(sid)
        tasks = [t for t in self.inflight.pop(sid, ()) if not t.done()]
        if not tasks:
            return

        async def drain() -> None:
            _, pending = await asyncio.wait(tasks, timeout=wait_timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

        loop = tasks[0].get_loop()
        try:
            if loop is asyncio.get_running_loop():
                await drain()
            else:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(drain(), loop))
        except Exception:
            self.logger.exception("[%s] sid=%s: draining its requests failed", self.log_prefix, sid)

    async def finish_session(
        self, sid: str, *, base_sample, reward: Any = 0.0, extra_metadata: dict | None = None, wait_timeout: float = 5.0
    ) -> list:
        """The session's samples (`TrajectoryManager.get_trajectory`), each with `.response` decoded
        from its response tokens; [] (and a warning) for a session with no turns."""
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        session = self.store.pop(sid, None)
        self._sid_turn_count.pop(sid, None)
        samples = self.manager.get_trajectory(
            sid,
            base_sample=base_sample,
            reward=reward,
            extra_metadata=extra_metadata,
            max_sample_tokens=session.max_context_tokens if session else 0,
        )
        if not samples:
            self.logger.warning("[%s] session %s ended with no turns: no samples", self.log_prefix, sid)
        for s in samples:
            n = s.response_length
            s.response = self.tokenizer.decode(s.tokens[-n:], skip_special_tokens=False) if n else ""
        return samples

    async def drop_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        await self.shutdown_session(sid, wait_timeout=wait_timeout)
        self.store.pop(sid, None)
        self._sid_turn_count.pop(sid, None)
        self.manager.drop_session(sid)

    # -- prompt rendering -------------------------------------------------------------------
    def _render_text(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        return render_chat(
            self.tokenizer, messages, tools, self.chat_template_kwargs, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_prompt(self, sid: str, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt token ids of a request (see the module docstring: replayed turns spliced in)."""
        full = self._render_text(messages, tools, True)
        hit = self.manager.match_history(sid, messages)
        if hit is not None and hit[1].output_ids:
            k, rec = hit
            spliced = list(rec.prompt_ids) + list(rec.output_ids)
            before = self._render_text(messages[:k], tools, True)
            # the template renders the reply as the model wrote it (plain text; also a turn cut by length)
            produced = before + self.tokenizer.decode(rec.output_ids, skip_special_tokens=False)
            if full.startswith(produced):
                return spliced + self._encode(full[len(produced) :])
            # the template renders the reply its own way (tool calls, reasoning, stripped spaces), but
            # closes it with the special token the model ended on (EOS): continue after that token
            if rec.output_ids[-1] in self._special_ids:
                end = self.tokenizer.decode([rec.output_ids[-1]], skip_special_tokens=False)
                upto = self._render_text(messages[: k + 1], tools, False)
                idx = upto.rfind(end)
                if idx >= len(before) and full.startswith(upto[: idx + len(end)]):
                    return spliced + self._encode(full[idx + len(end) :])
        return self._encode(full)

    # -- one turn ---------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.served_model_name, "object": "model", "created": 0, "owned_by": "slime"}],
            }
        )

    def _check_turn_cap(self, sid: str) -> None:
        cap = self.max_turns_per_sid
        if cap is None:
            return
        prior = self._sid_turn_count.get(sid, 0)
        if prior >= cap:
            self.logger.warning("[%s] sid=%s exceeded max_turns_per_sid=%d", self.log_prefix, sid, cap)
            raise AdapterError(
                429,
                "rate_limit_error",
                f"session {sid!r} exceeded max_turns_per_sid={cap}; no more turns are served",
                code="rate_limit_exceeded",
            )
        self._sid_turn_count[sid] = prior + 1

    def _sampling_params(self, session: Session, body: dict) -> dict:
        sp: dict[str, Any] = {"skip_special_tokens": False, "no_stop_trim": True, **session.sampling_defaults}
        for key in self.max_token_keys:
            if body.get(key) is not None:
                try:
                    n = int(body[key])
                except (TypeError, ValueError):
                    raise AdapterError(
                        400, "invalid_request_error", f"{key} must be an integer, got {body[key]!r}", param=key
                    ) from None
                if n < 1:
                    raise AdapterError(400, "invalid_request_error", f"{key} must be >= 1, got {n}", param=key)
                cap = sp.get("max_new_tokens")
                sp["max_new_tokens"] = n if cap is None else min(int(cap), n)
                break
        for key in ("temperature", "top_p", "top_k"):
            if body.get(key) is not None:
                sp[key] = body[key]
        if body.get("seed") is not None:
            sp["sampling_seed"] = body["seed"]
        for key in self.stop_keys:
            if body.get(key):
                stop = body[key]
                sp["stop"] = [stop] if isinstance(stop, str) else list(stop)
                break
        return sp

    async def _run_turn(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._turn(request)
        except AdapterError as e:
            return self._error(e)

    async def _turn(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        self._preprocess_body(body)
        sid = self._session_id(request, body)
        if sid in self.closed:
            raise AdapterError(
                503,
                "overloaded_error" if self.log_prefix.startswith("anthropic") else "server_error",
                f"session {sid!r} is closed",
            )
        self._check_turn_cap(sid)
        session = self.store.setdefault(sid, Session())  # an unknown session is served, as slime does
        task = asyncio.current_task()
        self.inflight.setdefault(sid, set()).add(task)
        t0 = time.monotonic()
        try:
            messages, tools = self._translate(body)
            if not messages:
                raise AdapterError(400, "invalid_request_error", "messages must be a non-empty list", param="messages")
            try:
                prompt_ids = self.render_prompt(sid, messages, tools)
            except Exception as e:  # the chat template refused the conversation
                raise AdapterError(
                    400,
                    "invalid_request_error",
                    f"the chat template could not render the messages: {e}",
                    param="messages",
                ) from e
            sp = self._sampling_params(session, body)
            if session.max_context_tokens > 0:
                room = session.max_context_tokens - len(prompt_ids)
                if room <= 0:
                    raise AdapterError(
                        400,
                        "invalid_request_error",
                        f"prompt is too long: {len(prompt_ids)} tokens >= max_context_tokens "
                        f"{session.max_context_tokens} of session {sid!r}",
                        code="context_length_exceeded",
                        param="messages",
                    )
                sp["max_new_tokens"] = (
                    room if sp.get("max_new_tokens") is None else min(int(sp["max_new_tokens"]), room)
                )
            turn = await self._generate(prompt_ids, sp, sid)
            out = turn.output_ids
            if out and turn.finish_reason == "stop" and out[-1] in self._special_ids:  # the end-of-turn token
                out = out[:-1]
            raw = self.tokenizer.decode(out, skip_special_tokens=False) if out else ""
            parsed = parse_model_output(
                raw, tools_schema=tools, tool_parser_name=self.tool_parser, reasoning_parser_name=self.reasoning_parser
            )
            reply = self._build_reply(parsed, turn.finish_reason)
            turn = dataclasses.replace(turn, ill_formed=parsed.ill_formed)
            stream = body.get("stream") is True
            try:  # answer first: a client that went away must not leave a turn it never saw
                response = await self._respond(request, body, reply, len(prompt_ids), len(turn.output_ids), stream)
            except ConnectionResetError:
                self.logger.warning(
                    "[%s] sid=%s client went away after %.1fs", self.log_prefix, sid, time.monotonic() - t0
                )
                return web.Response(status=499, text="client disconnected")
            if self.debug_callback is not None:
                try:
                    self.debug_callback(sid, messages, tools, reply.manager_message, turn)
                except Exception:
                    self.logger.exception("[%s] debug_callback failed (sid=%s)", self.log_prefix, sid)
            self.manager.record_turn(
                sid, turn=turn, prompt_messages=messages, response_message=reply.manager_message, metadata={"sid": sid}
            )
            return response
        finally:
            self.inflight.get(sid, set()).discard(task)

    async def _generate(self, prompt_ids: list[int], sp: dict, sid: str) -> TurnRecord:
        url = f"{self.sglang_url}/generate"
        headers = {"X-SMG-Routing-Key": sid}
        if self.engine_api_key is not None:
            headers["Authorization"] = f"Bearer {self.engine_api_key}"
        else:
            headers = auth_headers(url, headers) or headers
        rid = uuid.uuid4().hex
        payload = {"rid": rid, "input_ids": list(prompt_ids), "sampling_params": sp, "return_logprob": True}
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=900), trust_env=False
                ) as http,
                http.post(url, json=payload, headers=headers) as r,
            ):
                if r.status >= 400:
                    text = await r.text()
                    self.logger.warning("[%s] sid=%s engine answered %d: %.300s", self.log_prefix, sid, r.status, text)
                    if r.status < 500:
                        raise AdapterError(
                            400, "invalid_request_error", f"the engine refused the request: {text[:400]}"
                        )
                    raise AdapterError(502, "api_error", f"the engine failed ({r.status}): {text[:400]}")
                data = await r.json(content_type=None)
        except (TimeoutError, asyncio.CancelledError, aiohttp.ClientError) as e:
            if isinstance(e, aiohttp.ClientError):
                self.logger.warning("[%s] sid=%s engine unreachable: %s", self.log_prefix, sid, e)
            try:  # free the engine's slot now rather than at the turn's length limit
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5), trust_env=False) as http:
                    await http.post(
                        f"{self.sglang_url}/abort_request",
                        json={"rid": rid},
                        headers=auth_headers(f"{self.sglang_url}/abort_request")
                        if self.engine_api_key is None
                        else {"Authorization": f"Bearer {self.engine_api_key}"},
                    )
            except Exception:  # noqa: BLE001 - best effort: the engine's own error is raised below
                pass
            if isinstance(e, aiohttp.ClientError):
                raise AdapterError(502, "api_error", f"the engine is unreachable: {e}") from e
            raise
        meta = data.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        output_ids = [int(p[1]) for p in pairs] if pairs else list(data.get("output_ids") or [])
        log_probs = [float(p[0]) for p in pairs]
        finish = (meta.get("finish_reason") or {}).get("type") or "stop"
        version = meta.get("weight_version")
        return TurnRecord(
            prompt_ids=list(prompt_ids),
            output_ids=output_ids,
            finish_reason=finish,
            output_log_probs=log_probs,
            weight_version=None if version is None else str(version),
        )
