"""Generation: POST /generate (served ahead of FastAPI, see `http.generate_ahead_of`) and
GET /health_generate."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI

from slime.engine.http import error_body, error_response, parse_json, route
from slime.engine.sampling import BadRequest
from slime.engine.state import EngineState, QueueFull

# A body up to this size is parsed on the event loop (a thread hop costs more than the parse);
# a larger one in EngineState.parse_pool.
INLINE_PARSE_BYTES = 16 * 1024


def generate_handler(state: EngineState):
    """POST /generate from its raw body: (HTTP status, answer)."""

    def parse(raw: bytes):
        return state.parse_generate(parse_json(raw, allow_empty=False))

    async def generate(raw: bytes) -> tuple[int, Any]:
        try:
            if len(raw) <= INLINE_PARSE_BYTES:
                reqs, is_batch = parse(raw)
            else:  # off the event loop (EngineState.parse_pool)
                reqs, is_batch = await asyncio.get_running_loop().run_in_executor(state.parse_pool, parse, raw)
        except BadRequest as e:
            return 400, error_body(str(e))
        try:
            results = await state.run(reqs)
        except QueueFull as e:
            return 503, error_body(str(e))
        except Exception as e:  # noqa: BLE001 - an engine failure; answered as 500
            return 500, error_body(f"generation failed: {type(e).__name__}: {e}")
        return 200, results if is_batch else results[0]

    return generate


def add_generation_routes(app: FastAPI, state: EngineState) -> None:
    sch = state.scheduler

    async def health_generate():
        if not sch.alive:
            return error_response("engine worker is not running", 503)
        if sch.paused or sch.released:
            return {"status": "paused" if sch.paused else "memory released"}
        reqs, _ = state.parse_generate(
            {"input_ids": [state.runner.pad_token_id], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        )
        try:
            await asyncio.wait_for(state.run(reqs), timeout=60)
        except Exception as e:  # noqa: BLE001
            return error_response(f"health generation failed: {type(e).__name__}: {e}", 503)
        return {}

    route(app, "/health_generate", health_generate, methods=("GET",), body=False)
