"""The built-in inference engine: an HTTP server speaking a subset of SGLang's native API.

    python -m slime.engine.server --model-path DIR [--host 127.0.0.1] [--port 30000]
        [--dtype auto|float32|bfloat16] [--num-threads 1] [--random-seed 0]
        [--max-running-requests 256] [--context-length N] [--parent-pid PID] [--log-level info]

Endpoints (SGLang names and shapes):
  POST /generate                      text|input_ids (single or batch), sampling_params,
                                      return_logprob, logprob_start_len, rid
  GET  /health, /health_generate
  GET  /get_model_info, /model_info   model_path, tokenizer_path, is_generation, weight_version
  GET  /get_server_info, /server_info server args + version, weight_version
  GET  /get_load                      {"num_reqs", "num_tokens"}
  GET  /get_weight_version            POST /update_weight_version {"new_version"}
  POST /flush_cache, /abort_request {"rid" | "abort_all"}
  POST /pause_generation {"mode": abort|retract|in_place}, /continue_generation
  POST /release_memory_occupation, /resume_memory_occupation
  POST /update_weights_from_tensor {"serialized_named_tensors": [base64 safetensors], ...}
  POST /update_weights_from_disk {"model_path"}
  POST /init_weights_update_group {"master_address", "master_port", "rank_offset", "world_size",
                                   "group_name", "backend": "gloo"}
  POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name", ...}
  POST /destroy_weights_update_group {"group_name"}

Errors a client causes answer HTTP 400 with {"error": {"message": ...}, "success": false}.
The log-prob semantics are documented in `slime.engine.sampling`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Request  # module level: route annotations are resolved from these globals

from slime.utils.threads import configure_torch_threads

logger = logging.getLogger("slime.engine.server")

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    import json

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    _loads = json.loads


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slime.engine.server",
        description="slime's built-in inference engine (a subset of SGLang's HTTP API, CPU).",
    )
    p.add_argument("--model-path", "--hf-checkpoint", dest="model_path", required=True,
                   help="local HF model directory (--hf-checkpoint is slime's name for it)")
    p.add_argument("--tokenizer-path", default=None, help="defaults to --model-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--num-threads", type=int, default=1, help="torch threads of this server")
    p.add_argument("--random-seed", type=int, default=0, help="seed of sampling without sampling_seed")
    p.add_argument("--max-running-requests", type=int, default=256, help="rows in one batch at most")
    p.add_argument("--context-length", type=int, default=None,
                   help="max prompt + new tokens (default: the model's max_position_embeddings)")
    p.add_argument("--batch-wait-ms", type=float, default=0.0,
                   help="wait up to this long for more requests before starting a batch")
    p.add_argument("--weight-version", default="default", help="initial weight_version")
    p.add_argument("--step-delay-ms", type=float, default=0.0,
                   help="sleep this long after every decode step (testing aborts and pauses only)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process is gone (no orphan servers)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix reuse at all: neither identical prompts in a batch nor the prefix cache "
                        "(SGLang's flag name)")
    p.add_argument("--prefix-cache-tokens", type=int, default=16384,
                   help="token positions of KV kept from finished requests for later requests with the same "
                        "prefix (0: off)")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="fraction of the machine's memory for weights + KV cache; sets the KV token budget "
                        "(SGLang's meaning; default: no token budget, only --max-running-requests)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV token budget of the running batch (overrides --mem-fraction-static)")
    p.add_argument("--model-impl", default="auto", choices=["auto", "native", "sglang", "transformers"],
                   help="forward implementation (SGLang's flag): native (the engine's own, Llama-family models; "
                        "'sglang' is an alias), transformers (the model's HF forward), auto (native where it covers "
                        "the model)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    return p


# ------------------------------------------------------------------------------------ requests
_TOP_LEVEL_NEUTRAL: dict[str, Any] = {
    "stream": False,
    "top_logprobs_num": 0,
    "token_ids_logprob": None,
    "lora_path": None,
    "lora_id": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "input_embeds": None,
    "return_hidden_states": False,
    "return_routed_experts": False,
    "custom_logit_processor": None,
    "session_params": None,
    # sglang-router (0.3.x) fills these in on every request it forwards:
    "return_bytes": False,
    "return_entropy": False,
}
_TOP_LEVEL_IGNORED = {
    "log_metrics", "modalities", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
    "data_parallel_rank", "routed_dp_rank", "priority", "extra_key", "background", "no_logs",
    "conversation_id", "label", "received_time", "custom_labels", "routing_key",
    "model",  # sglang-router adds the served model name when it forwards a request
}
_TOP_LEVEL = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "rid",
              "return_text_in_logprobs"}


def _bad(msg: str):
    from slime.engine.sampling import BadRequest

    return BadRequest(msg)


def _per_item(value: Any, n: int, name: str, is_batch: bool) -> list:
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise _bad(f"{name} has {len(value)} entries but the batch has {n} prompts")
        return value
    return [value] * n


def _prefix_cache_stats(runner) -> dict:
    pc = runner.prefix_cache
    if pc is None:
        return {"prefix_cache": None}
    return {"prefix_cache": {"entries": len(pc), "tokens": pc.num_tokens, "max_tokens": pc.max_tokens,
                             "hits": pc.hits, "hit_tokens": pc.hit_tokens}}


def _machine_memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def kv_token_budget(args: argparse.Namespace, runner) -> int | None:
    """`--max-total-tokens`, or what `--mem-fraction-static` of the machine's memory leaves for the
    KV cache after the weights (SGLang's rule, with RAM for GPU memory); None: no budget."""
    if args.max_total_tokens is not None:
        if args.max_total_tokens < 1:
            raise SystemExit(f"--max-total-tokens must be >= 1, got {args.max_total_tokens}")
        return int(args.max_total_tokens)
    if args.mem_fraction_static is None:
        return None
    if not 0.0 < args.mem_fraction_static <= 1.0:
        raise SystemExit(f"--mem-fraction-static must be in (0, 1], got {args.mem_fraction_static}")
    free = args.mem_fraction_static * _machine_memory_bytes() - runner.weight_bytes()
    tokens = int(free // runner.kv_bytes_per_token())
    if tokens < runner.context_length:
        raise SystemExit(f"--mem-fraction-static {args.mem_fraction_static} leaves room for {max(tokens, 0)} KV "
                         f"tokens, less than one request of the context length {runner.context_length}")
    return tokens


class EngineState:
    def __init__(self, args: argparse.Namespace):
        from slime.engine.model_runner import ModelRunner
        from slime.engine.scheduler import Scheduler

        self.args = args
        t0 = time.perf_counter()
        self.runner = ModelRunner(
            args.model_path, dtype=args.dtype, context_length=args.context_length,
            tokenizer_path=args.tokenizer_path, trust_remote_code=args.trust_remote_code,
            share_prefix=not args.disable_radix_cache, prefix_cache_tokens=args.prefix_cache_tokens,
            model_impl=args.model_impl,
        )
        self.model_path = args.model_path
        self.max_total_tokens = kv_token_budget(args, self.runner)
        self.scheduler = Scheduler(
            self.runner, max_running_requests=args.max_running_requests, max_total_tokens=self.max_total_tokens,
            batch_wait_s=args.batch_wait_ms / 1000.0, seed=args.random_seed,
            deliver=self._deliver, weight_version=args.weight_version,
            step_delay_s=args.step_delay_ms / 1000.0,
        )
        self.scheduler.start()
        self.load_time = time.perf_counter() - t0
        self.release_tags: list[str] = []
        # torch.distributed groups for update_weights_from_distributed, by group_name
        self.weight_groups: dict[str, Any] = {}
        self.weight_group_locks: dict[str, asyncio.Lock] = {}

    # called on the worker thread
    def _deliver(self, reqs) -> None:
        by_loop: dict[Any, list] = defaultdict(list)
        for r in reqs:
            if r.future is None:
                continue
            if r.error is not None:
                by_loop[r.loop].append((r.future, None, r.error))
            else:
                by_loop[r.loop].append((r.future, self.build_result(r), None))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_resolve, items)

    def build_result(self, r) -> dict:
        tok = self.runner.tokenizer
        p = r.params
        fr = r.finish_reason or {"type": "abort"}
        ids = r.output_ids
        matched = fr.get("matched")
        if fr["type"] == "stop" and isinstance(matched, int) and not p.no_stop_trim:
            ids = ids[:-1]
        text = tok.decode(ids, skip_special_tokens=p.skip_special_tokens) if ids else ""
        if isinstance(matched, str) and not p.no_stop_trim and r.stop_str_pos is not None:
            text = text[: r.stop_str_pos]
        meta = {
            "id": r.rid,
            "finish_reason": fr,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": r.cached_tokens,
            "weight_version": r.weight_version or self.scheduler.weight_version,
            "e2e_latency": time.perf_counter() - r.created,
        }
        if r.return_logprob:
            if r.return_text_in_logprobs:
                texts = [tok.decode([t]) for t in r.output_ids]
                meta["output_token_logprobs"] = [[lp, t, s] for lp, t, s in zip(r.output_logprobs, r.output_ids, texts)]
            else:
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(r.output_logprobs, r.output_ids)]
            if r.logprob_start_len >= 0:
                start = min(r.logprob_start_len, len(r.input_ids))
                in_ids = r.input_ids[start:]
                lps = r.input_logprobs or [None] * len(in_ids)
                if r.return_text_in_logprobs:
                    meta["input_token_logprobs"] = [[lp, t, tok.decode([t])] for lp, t in zip(lps, in_ids)]
                else:
                    meta["input_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, in_ids)]
        return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}

    def parse_generate(self, body: Any):
        """Validate a /generate body; returns (list of Req, is_batch)."""
        import torch

        from slime.engine.sampling import SamplingParams
        from slime.engine.scheduler import Req

        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        for key, value in body.items():
            if key in _TOP_LEVEL or key in _TOP_LEVEL_IGNORED:
                continue
            if key in _TOP_LEVEL_NEUTRAL:
                if value not in (None, _TOP_LEVEL_NEUTRAL[key]):
                    raise _bad(f"{key}={value!r} is not supported by the built-in engine")
                continue
            raise _bad(f"unknown field {key!r} in /generate request")
        text, input_ids = body.get("text"), body.get("input_ids")
        if (text is None) == (input_ids is None):
            raise _bad("give exactly one of 'text' and 'input_ids'")
        runner = self.runner
        vocab = runner.vocab_size
        if input_ids is not None:
            if not isinstance(input_ids, list) or not input_ids:
                raise _bad("input_ids must be a non-empty list of token ids (or a list of such lists)")
            is_batch = isinstance(input_ids[0], list)
            prompts = input_ids if is_batch else [input_ids]
            for b, ids in enumerate(prompts):
                where = f"input_ids[{b}]" if is_batch else "input_ids"
                if not isinstance(ids, list) or not ids:
                    raise _bad(f"{where} must be a non-empty list of token ids")
                for t in ids:
                    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                        raise _bad(f"{where} contains {t!r}, not a token id in [0, {vocab})")
        else:
            is_batch = isinstance(text, list)
            texts = text if is_batch else [text]
            if not texts or not all(isinstance(t, str) for t in texts):
                raise _bad("text must be a string or a non-empty list of strings")
            prompts = [runner.tokenizer.encode(t) for t in texts]
            for b, ids in enumerate(prompts):
                if not ids:
                    raise _bad(f"text{f'[{b}]' if is_batch else ''} encodes to no tokens")
        n = len(prompts)
        sp_list = _per_item(body.get("sampling_params"), n, "sampling_params", is_batch)
        rl_list = _per_item(body.get("return_logprob", False), n, "return_logprob", is_batch)
        ls_list = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len", is_batch)
        tl_list = _per_item(body.get("return_text_in_logprobs", False), n, "return_text_in_logprobs", is_batch)
        rid = body.get("rid")
        if is_batch and rid is not None and not isinstance(rid, list):
            raise _bad("rid must be a list of strings for a batch request")
        rid_list = _per_item(rid, n, "rid", is_batch)
        cache: dict[int, SamplingParams] = {}
        reqs = []
        for b in range(n):
            where = f"[{b}]" if is_batch else ""
            sp_raw = sp_list[b]
            key = id(sp_raw)
            if key not in cache:
                cache[key] = SamplingParams.from_dict(sp_raw, vocab_size=vocab, where=f"sampling_params{where}")
            sp = cache[key]
            rl, ls, tl, r_id = rl_list[b], ls_list[b], tl_list[b], rid_list[b]
            if rl is None:
                rl = False
            if not isinstance(rl, bool):
                raise _bad(f"return_logprob{where} must be true or false, got {rl!r}")
            if not isinstance(tl, bool):
                raise _bad(f"return_text_in_logprobs{where} must be true or false, got {tl!r}")
            if ls is None:
                ls = -1
            if isinstance(ls, bool) or not isinstance(ls, int) or ls < -1:
                raise _bad(f"logprob_start_len{where} must be an integer >= -1, got {ls!r}")
            if r_id is not None and not isinstance(r_id, str):
                raise _bad(f"rid{where} must be a string, got {r_id!r}")
            ids = prompts[b]
            if len(ids) + sp.max_new_tokens > runner.context_length:
                raise _bad(
                    f"prompt{where} has {len(ids)} tokens and max_new_tokens is {sp.max_new_tokens}: "
                    f"together more than the context length {runner.context_length}"
                )
            budget = self.max_total_tokens
            if budget is not None and len(ids) + sp.max_new_tokens > budget:
                raise _bad(
                    f"prompt{where} has {len(ids)} tokens and max_new_tokens is {sp.max_new_tokens}: "
                    f"together more than the KV token budget {budget} (--max-total-tokens / --mem-fraction-static)"
                )
            stop_ids = set(sp.stop_token_ids)
            if not sp.ignore_eos:
                stop_ids |= runner.eos_token_ids
            req = Req(input_ids=list(ids), params=sp, return_logprob=rl, logprob_start_len=ls,
                      return_text_in_logprobs=tl, stop_ids=frozenset(stop_ids))
            if r_id is not None:
                req.rid = r_id
            if sp.sampling_seed is not None:
                req.generator = torch.Generator().manual_seed(sp.sampling_seed)
            reqs.append(req)
        return reqs, is_batch

    def info(self) -> dict:
        sch = self.scheduler
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.runner.tokenizer_path,
            "is_generation": True,
            "weight_version": sch.weight_version,
            "model_type": getattr(self.runner.config, "model_type", None),
            "model_impl": self.runner.model_impl,
            "vocab_size": self.runner.vocab_size,
            "context_length": self.runner.context_length,
            "max_total_num_tokens": self.max_total_tokens,
            "preferred_sampling_params": None,
        }


def _error_body(msg: str) -> dict:
    return {"error": {"message": msg}, "success": False, "message": msg}


def _parse_json(raw: bytes, allow_empty: bool) -> Any:
    if not raw.strip():
        if allow_empty:
            return {}
        raise _bad("empty request body; expected a JSON object")
    try:
        return _loads(raw)
    except ValueError as e:
        raise _bad(f"request body is not valid JSON: {e}") from None


def _generate_ahead_of(app, handle):
    """`app` with POST /generate answered by `handle(raw body) -> (status, answer)` in a plain
    ASGI handler, ahead of FastAPI's middleware and routing: a rollout sends hundreds of requests
    at once, and FastAPI's per-request layers were more than half of taking one in (512
    requests: 0.30 s through FastAPI, 0.12 s here)."""
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
        status, answer = await handle(b"".join(chunks))
        body = _dumps(answer)
        await send({"type": "http.response.start", "status": status,
                    "headers": json_headers + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return asgi


def _resolve(items) -> None:
    for fut, result, err in items:
        if fut.done():
            continue
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(result)


# ------------------------------------------------------------------------------------ app
def create_app(state: EngineState):
    from fastapi import FastAPI
    from fastapi.responses import Response

    from slime.engine.model_runner import WeightUpdateError
    from slime.engine.sampling import BadRequest

    @asynccontextmanager
    async def lifespan(app):
        logger.info("engine server ready at http://%s:%d (model loaded in %.1fs)",
                    state.args.host, state.args.port, state.load_time)
        yield
        state.scheduler.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    sch = state.scheduler

    def ok(obj: Any = None, status: int = 200) -> Response:
        return Response(content=_dumps(obj if obj is not None else {}), status_code=status,
                        media_type="application/json")

    def error(msg: str, status: int = 400) -> Response:
        return ok(_error_body(msg), status)

    async def read_json(request: Request, *, allow_empty: bool = True) -> Any:
        return _parse_json(await request.body(), allow_empty)

    async def control(fn, *, needs_idle: bool = True):
        return await asyncio.wrap_future(sch.run_control(fn, needs_idle=needs_idle))

    async def generate(raw: bytes) -> tuple[int, Any]:
        """POST /generate from its raw body: (HTTP status, answer). Served by
        `_generate_ahead_of`, not by a FastAPI route."""
        try:
            reqs, is_batch = state.parse_generate(_parse_json(raw, allow_empty=False))
        except BadRequest as e:
            return 400, _error_body(str(e))
        loop = asyncio.get_running_loop()
        futs = []
        for r in reqs:
            r.loop = loop
            r.future = loop.create_future()
            futs.append(r.future)
        sch.submit(reqs)
        try:
            results = await asyncio.gather(*futs)
        except Exception as e:  # noqa: BLE001 - an engine failure; answered as 500
            return 500, _error_body(f"generation failed: {type(e).__name__}: {e}")
        return 200, results if is_batch else results[0]

    @app.get("/health")
    async def health():
        if not sch.alive:
            return error("engine worker is not running", 503)
        return ok({})

    @app.get("/health_generate")
    async def health_generate():
        if not sch.alive:
            return error("engine worker is not running", 503)
        if sch.paused or sch.released:
            return ok({"status": "paused" if sch.paused else "memory released"})
        reqs, _ = state.parse_generate({"input_ids": [state.runner.pad_token_id],
                                        "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        loop = asyncio.get_running_loop()
        reqs[0].loop, reqs[0].future = loop, loop.create_future()
        sch.submit(reqs)
        try:
            await asyncio.wait_for(reqs[0].future, timeout=60)
        except Exception as e:  # noqa: BLE001
            return error(f"health generation failed: {type(e).__name__}: {e}", 503)
        return ok({})

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        return ok(state.info())

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        from slime import __version__

        info = dict(vars(state.args))
        info.update(
            version=__version__,
            engine="slime-builtin",
            weight_version=sch.weight_version,
            context_length=state.runner.context_length,
            max_total_num_tokens=state.max_total_tokens,
            model_path=state.model_path,
            paused=sch.paused,
            memory_released=sch.released,
            stats=dict(sch.stats(), **_prefix_cache_stats(state.runner)),
        )
        return ok(info)

    @app.get("/get_load")
    async def get_load():
        return ok(sch.load())

    @app.get("/get_weight_version")
    async def get_weight_version():
        return ok({"weight_version": sch.weight_version})

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        try:
            body = await read_json(request)
            v = body.get("new_version")
            if not isinstance(v, str) or not v:
                raise BadRequest("new_version must be a non-empty string")
        except BadRequest as e:
            return error(str(e))
        if body.get("abort_all_requests"):
            sch.abort(abort_all=True)
        sch.weight_version = v
        return ok({"success": True, "message": f"weight_version is {v}"})

    @app.api_route("/flush_cache", methods=["POST", "GET"])
    async def flush_cache():
        # Waits for the running batch, then drops the prefix cache (a running batch's own KV dies
        # with it). No gc.collect(): it costs ~0.2 s with torch loaded.
        await control(state.runner.clear_prefix_cache)
        return ok({"success": True, "message": "Cache flushed."})

    @app.post("/abort_request")
    async def abort_request(request: Request):
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
        except BadRequest as e:
            return error(str(e))
        if body.get("abort_all"):
            n = sch.abort(abort_all=True)
        else:
            rid = body.get("rid")
            if rid is None or rid == "":
                return error("give 'rid' (a string or a list) or 'abort_all': true")
            n = sch.abort(rids=rid if isinstance(rid, list) else [rid])
        return ok({"success": True, "num_aborted": n})

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        try:
            body = await read_json(request)
            mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
            if mode not in ("abort", "retract", "in_place"):
                raise BadRequest(f"mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        except BadRequest as e:
            return error(str(e))
        sch.pause(mode)
        return ok({"success": True, "message": f"generation paused (mode {mode})"})

    @app.post("/continue_generation")
    async def continue_generation():
        sch.resume()
        return ok({"success": True, "message": "generation continues"})

    @app.post("/release_memory_occupation")
    async def release_memory_occupation(request: Request):
        try:
            body = await read_json(request)
        except BadRequest as e:
            return error(str(e))
        tags = body.get("tags") if isinstance(body, dict) else None

        def do():
            # The batch's KV cache is freed by reference counting when the batch ends;
            # no gc.collect() (it costs ~0.2 s per call with torch loaded, every training step).
            sch.set_released(True)
            state.release_tags = list(tags or ["kv_cache", "weights"])
            if "kv_cache" in state.release_tags:
                state.runner.clear_prefix_cache()

        await control(do)
        return ok({"success": True, "message": "memory released; generation waits for resume"})

    @app.post("/resume_memory_occupation")
    async def resume_memory_occupation(request: Request):
        try:
            await read_json(request)
        except BadRequest as e:
            return error(str(e))
        # not a control operation: the worker may be waiting for exactly this
        sch.set_released(False)
        return ok({"success": True, "message": "memory resumed"})

    def _bump_version(version: str | None) -> str:
        sch.num_weight_updates += 1
        sch.weight_version = version if version is not None else str(sch.num_weight_updates)
        return sch.weight_version

    async def _apply_update(named, body: dict, what: str) -> Response:
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            return error("weight_version must be a string")
        try:
            state.runner.validate_named_tensors(named)
        except WeightUpdateError as e:
            return error(f"{what}: {e}")
        if body.get("abort_all_requests"):
            sch.abort(abort_all=True)
        flush = body.get("flush_cache", True)

        def do():
            n = state.runner.load_named_tensors(named)
            return n, _bump_version(version)

        try:
            n, v = await control(do, needs_idle=bool(flush))
        except WeightUpdateError as e:
            return error(f"{what}: {e}")
        return ok({"success": True, "message": f"{what}: updated {n} tensors; weight_version {v}",
                   "weight_version": v, "num_tensors": n})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request):
        try:
            body = await read_json(request, allow_empty=False)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            blobs = body.get("serialized_named_tensors")
            if isinstance(blobs, str):
                blobs = [blobs]
            if not isinstance(blobs, list) or not blobs or not all(isinstance(b, str) for b in blobs):
                raise BadRequest("serialized_named_tensors must be a non-empty list of base64 strings")
            fmt = body.get("load_format")
            if fmt not in (None, "safetensors", "safetensors_base64"):
                raise BadRequest(f"load_format {fmt!r} is not supported (base64 safetensors only)")
        except BadRequest as e:
            return error(str(e))

        def decode():
            from safetensors.torch import load as st_load

            named = {}
            for b in blobs:
                named.update(st_load(base64.b64decode(b)))
            return named

        try:
            named = await asyncio.to_thread(decode)
        except Exception as e:  # noqa: BLE001
            return error(f"cannot decode serialized_named_tensors: {type(e).__name__}: {e}")
        return await _apply_update(named, body, "update_weights_from_tensor")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        try:
            body = await read_json(request, allow_empty=False)
            path = body.get("model_path") if isinstance(body, dict) else None
            if not isinstance(path, str) or not path:
                raise BadRequest("model_path must be a directory path")
        except BadRequest as e:
            return error(str(e))
        from slime.engine.model_runner import ModelRunner

        try:
            named = await asyncio.to_thread(ModelRunner.read_safetensors_dir, path)
        except WeightUpdateError as e:
            return error(f"update_weights_from_disk: {e}")
        except Exception as e:  # noqa: BLE001
            return error(f"update_weights_from_disk: cannot read {path!r}: {type(e).__name__}: {e}")
        resp = await _apply_update(named, body, "update_weights_from_disk")
        if resp.status_code == 200:
            state.model_path = path
        return resp

    # ------------------------------------------------------------ distributed weight update
    def _int_field(body: dict, key: str, lo: int, hi: int | None = None) -> int:
        v = body.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise BadRequest(f"{key} must be an integer {rng}, got {v!r}")
        return v

    def _group_name(body: dict) -> str:
        from slime.sync.distributed import DEFAULT_GROUP_NAME

        name = body.get("group_name", DEFAULT_GROUP_NAME)
        if not isinstance(name, str) or not name:
            raise BadRequest(f"group_name must be a non-empty string, got {name!r}")
        return name

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        from slime.sync.distributed import create_gloo_group

        try:
            body = await read_json(request, allow_empty=False)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            addr = body.get("master_address")
            if not isinstance(addr, str) or not addr:
                raise BadRequest(f"master_address must be a host name or address, got {addr!r}")
            port = _int_field(body, "master_port", 1, 65535)
            world = _int_field(body, "world_size", 2)
            rank = _int_field(body, "rank_offset", 1, world - 1)  # one rank per engine (no tensor parallel)
            name = _group_name(body)
            backend = body.get("backend", "gloo")
            if backend != "gloo":
                raise BadRequest(f"backend {backend!r} is not available in the built-in (CPU) engine; use 'gloo'")
            if name in state.weight_groups:
                raise BadRequest(f"weight update group {name!r} already exists; destroy it first")
        except BadRequest as e:
            return error(str(e))
        timeout = float(body.get("timeout", 120)) if isinstance(body.get("timeout", 120), (int, float)) else 120.0
        try:
            pg = await asyncio.to_thread(create_gloo_group, addr, port, rank, world, name, timeout)
        except Exception as e:  # noqa: BLE001 - rendezvous failed (wrong address/port, timeout)
            return error(f"init_weights_update_group: cannot join {name!r} at {addr}:{port} as rank {rank} "
                         f"of {world}: {type(e).__name__}: {e}")
        state.weight_groups[name] = pg
        state.weight_group_locks[name] = asyncio.Lock()
        return ok({"success": True, "message": f"joined weight update group {name!r} as rank {rank} of {world}"})

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        try:
            body = await read_json(request)
            name = _group_name(body if isinstance(body, dict) else {})
            if name not in state.weight_groups:
                raise BadRequest(f"no weight update group {name!r}")
        except BadRequest as e:
            return error(str(e))
        pg = state.weight_groups.pop(name)
        state.weight_group_locks.pop(name, None)
        pg.shutdown()
        return ok({"success": True, "message": f"weight update group {name!r} destroyed"})

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        import torch

        from slime.sync.distributed import parse_dtype

        try:
            body = await read_json(request, allow_empty=False)
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
            for key, v in (("names", names), ("dtypes", dtypes), ("shapes", shapes)):
                if not isinstance(v, list) or not v:
                    raise BadRequest(f"{key} must be a non-empty list")
            if not len(names) == len(dtypes) == len(shapes):
                raise BadRequest(f"names, dtypes and shapes must have equal lengths, got "
                                 f"{len(names)}, {len(dtypes)}, {len(shapes)}")
            specs = []
            for n, d, sh in zip(names, dtypes, shapes):
                if not isinstance(n, str):
                    raise BadRequest(f"names must be strings, got {n!r}")
                try:
                    dt = parse_dtype(d)
                except ValueError as e:
                    raise BadRequest(f"dtype of {n!r}: {e}") from None
                if not isinstance(sh, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                       for x in sh):
                    raise BadRequest(f"shape of {n!r} must be a list of non-negative integers, got {sh!r}")
                specs.append((n, dt, sh))
            name = _group_name(body)
            if name not in state.weight_groups:
                raise BadRequest(f"no weight update group {name!r}; call /init_weights_update_group first")
            fmt = body.get("load_format")
            if fmt is not None:
                raise BadRequest(f"load_format {fmt!r} is not supported by update_weights_from_distributed")
        except BadRequest as e:
            return error(str(e))
        pg = state.weight_groups[name]

        def receive():
            # Every tensor announced is received, even ones the model will reject, so the
            # sender's broadcasts complete and the group stays usable.
            out = {}
            for n, dt, sh in specs:
                t = torch.empty(sh, dtype=dt)
                pg.broadcast(t, root=0)
                out[n] = t
            return out

        async with state.weight_group_locks[name]:
            try:
                named = await asyncio.to_thread(receive)
            except Exception as e:  # noqa: BLE001
                state.weight_groups.pop(name, None)  # a broken group is not reused
                state.weight_group_locks.pop(name, None)
                return error(f"update_weights_from_distributed: broadcast in {name!r} failed: "
                             f"{type(e).__name__}: {e}", 500)
        return await _apply_update(named, body, "update_weights_from_distributed")

    return _generate_ahead_of(app, generate)


# ------------------------------------------------------------------------------------ process
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def start_parent_watchdog(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    direct_child = os.getppid() == parent_pid

    def parent_alive() -> bool:
        if direct_child and os.getppid() != parent_pid:  # re-parented: the parent died
            return False
        return _pid_alive(parent_pid)

    def watch():
        while parent_alive():
            time.sleep(interval)
        logger.warning("parent process %d is gone; shutting the engine server down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(1)

    t = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    from slime.errors import SlimeError
    from slime.preflight import check_hf_checkpoint

    args = build_arg_parser().parse_args(argv)
    try:
        check_hf_checkpoint(args.model_path, "--model-path")
    except SlimeError as e:
        print(f"slime serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.parent_pid:
        start_parent_watchdog(args.parent_pid)
    configure_torch_threads(args.num_threads)
    # The worker thread and the event loop share the GIL; hand it over quickly.
    sys.setswitchinterval(0.001)
    import uvicorn

    state = EngineState(args)
    app = create_app(state)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        timeout_graceful_shutdown=3, lifespan="on",
        # a rollout opens hundreds of connections at once, and keeps them between rollouts
        timeout_keep_alive=120, backlog=4096,
    )
    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # answer in-flight requests now (finish_reason abort, partial output) instead of
            # letting the graceful shutdown wait for them
            state.scheduler.abort(abort_all=True)
            super().handle_exit(sig, frame)

    server = _Server(config)
    server.run()
    state.scheduler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
