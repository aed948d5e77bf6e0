"""Control: health and info, load, weight version, cache flush, aborts, pause/continue, and
memory release/resume (colocated training takes the cores while the engine's KV is freed)."""

from __future__ import annotations

from fastapi import FastAPI

from slime.engine.http import error_response, route
from slime.engine.sampling import BadRequest
from slime.engine.state import EngineState
from slime.runtime.memory import trim_heap

PAUSE_MODES = ("abort", "retract", "in_place")


def add_control_routes(app: FastAPI, state: EngineState) -> None:
    sch = state.scheduler

    async def health():
        return {} if sch.alive else error_response("engine worker is not running", 503)

    async def model_info():
        return state.model_info()

    async def server_info():
        return state.server_info()

    async def get_load():
        return sch.load()

    async def get_weight_version():
        return {"weight_version": sch.weight_version}

    for paths, handler in (
        (("/health",), health),
        (("/get_model_info", "/model_info"), model_info),
        (("/get_server_info", "/server_info"), server_info),
        (("/get_load",), get_load),
        (("/get_weight_version",), get_weight_version),
    ):
        route(app, paths, handler, methods=("GET",), body=False)

    async def update_weight_version(body: dict):
        v = body.get("new_version")
        if not isinstance(v, str) or not v:
            raise BadRequest("new_version must be a non-empty string")
        if body.get("abort_all_requests"):
            sch.abort(abort_all=True)
        sch.weight_version = v
        return {"success": True, "message": f"weight_version is {v}"}

    async def flush_cache():
        # Waits for the running batch, then drops the prefix cache (a running batch's own KV dies
        # with it). No gc.collect(): it costs ~0.2 s with torch loaded.
        await state.control(state.runner.clear_prefix_cache)
        return {"success": True, "message": "Cache flushed."}

    async def abort_request(body: dict):
        if body.get("abort_all"):
            return {"success": True, "num_aborted": sch.abort(abort_all=True)}
        rid = body.get("rid")
        if rid is None or rid == "":
            raise BadRequest("give 'rid' (a string or a list) or 'abort_all': true")
        return {"success": True, "num_aborted": sch.abort(rids=rid if isinstance(rid, list) else [rid])}

    async def pause_generation(body: dict):
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        sch.pause(mode)
        return {"success": True, "message": f"generation paused (mode {mode})"}

    async def continue_generation():
        sch.resume()
        return {"success": True, "message": "generation continues"}

    route(app, "/update_weight_version", update_weight_version)
    route(app, "/flush_cache", flush_cache, methods=("POST", "GET"), body=False)
    route(app, "/abort_request", abort_request)
    route(app, "/pause_generation", pause_generation)
    route(app, "/continue_generation", continue_generation, body=False)
    _add_memory_routes(app, state)


def _add_memory_routes(app: FastAPI, state: EngineState) -> None:
    sch = state.scheduler

    async def release_memory_occupation(body: dict):
        tags = body.get("tags")

        def release():
            # The batch's KV cache is freed by reference counting when the batch ends;
            # no gc.collect() (it costs ~0.2 s per call with torch loaded, every training step).
            sch.set_released(True)
            state.release_tags = list(tags or ["kv_cache", "weights"])
            if "kv_cache" in state.release_tags:
                state.runner.clear_prefix_cache()
                trim_heap()  # the cached KV's pages back to the system (--offload-rollout)

        await state.control(release)
        return {"success": True, "message": "memory released; generation waits for resume"}

    async def resume_memory_occupation(body: dict):
        # not a control operation: the worker may be waiting for exactly this
        sch.set_released(False)
        return {"success": True, "message": "memory resumed"}

    route(app, "/release_memory_occupation", release_memory_occupation)
    route(app, "/resume_memory_occupation", resume_memory_occupation)
