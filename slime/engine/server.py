"""The built-in inference engine: an HTTP server speaking a subset of SGLang's native API.

    python -m slime.engine.server --model-path DIR [--host 127.0.0.1] [--port 30000]
        [--dtype auto|float32|bfloat16] [--num-threads N (all cores)] [--random-seed 0]
        [--max-running-requests 256] [--context-length N] [--parent-pid PID] [--log-level info]
        [--served-model-name NAME] [--tool-call-parser qwen25|...] [--reasoning-parser qwen3|...]
        [any other option of `sglang.launch_server`: accepted, named at start-up as not used]

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

OpenAI-compatible (SGLang's fields and error shape; docs/openai-api.md):
  GET  /v1/models, /v1/models/{id}    the served model (--served-model-name, else --model-path)
  POST /v1/completions                prompt (text or token ids, one or a list), max_tokens, n,
                                      temperature, top_p, top_k, min_p, stop, seed, logprobs,
                                      echo, stream, ...
  POST /v1/chat/completions           messages (the model's chat template), tools (parsed with
                                      --tool-call-parser), logprobs + top_logprobs, stream, ...

Who may call (`slime.engine.guard`): with --api-key (or $SLIME_API_KEY) every endpoint but
/health and /health_generate needs `Authorization: Bearer <key>` (401 otherwise); with
--admin-api-key the weight and control endpoints need that key instead (SGLang's rules). Host
must be loopback or the bound host, a present Origin the server's own (403 otherwise); POST
bodies must be application/json (415) and under --max-request-body-mb (413); more than
--max-queued-requests waiting answer 503; /update_weights_from_disk reads only --model-path and
--weight-load-dirs (403 otherwise); a client that disconnects has its /generate aborted.

Errors a client causes answer HTTP 400 with {"error": {"message": ...}, "success": false}; on
/v1/* with {"object": "error", "message", "type", "param", "code"} (SGLang's OpenAI shape).
The log-prob semantics are documented in `slime.engine.sampling`.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from slime.engine.args import check_model_dir, parse_server_args, resolve_device, server_threads
from slime.engine.guard import Policy, guarded
from slime.engine.http import generate_ahead_of
from slime.engine.routes.control import add_control_routes
from slime.engine.routes.generation import add_generation_routes, generate_handler
from slime.engine.routes.openai import openai_ahead_of
from slime.engine.routes.weights import add_weight_routes
from slime.engine.state import EngineState
from slime.errors import SlimeError
from slime.runtime.mkl_vendor import reexec_with_shim
from slime.runtime.process import start_parent_watchdog
from slime.runtime.threads import configure_torch_threads
from slime.utils.misc import set_hub_env

logger = logging.getLogger("slime.engine.server")


def create_app(state: EngineState):
    """The ASGI app: FastAPI for every route but /generate and /v1/*, which plain handlers serve first."""

    @asynccontextmanager
    async def lifespan(app):
        logger.info(
            "engine server ready at http://%s:%d (model loaded in %.1fs)",
            state.args.host,
            state.args.port,
            state.load_time,
        )
        yield
        state.scheduler.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    add_generation_routes(app, state)
    add_control_routes(app, state)
    add_weight_routes(app, state)
    app_and_v1 = openai_ahead_of(app, state)
    return guarded(generate_ahead_of(app_and_v1, generate_handler(state)), guard_policy(state))


def guard_policy(state: EngineState) -> Policy:
    """Keys, hosts and body caps of this server (`slime.engine.guard`)."""
    args = state.args
    mib = 1024**2
    if args.max_weight_update_mb is not None:
        weight_cap = int(args.max_weight_update_mb * mib)
    else:  # a full state dict in float32, base64 (4/3), and room for the JSON around it
        numel = sum(p.numel() for p in state.runner.model.parameters())
        weight_cap = int(numel * 4 * 4 / 3 * 1.1) + 64 * mib
    return Policy.for_server(
        args.host,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        max_body=int(args.max_request_body_mb * mib),
        max_weight_body=weight_cap,
    )


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: EngineState):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame):
        # answer in-flight requests now (finish_reason abort, partial output) instead of
        # letting the graceful shutdown wait for them
        self.state.scheduler.abort(abort_all=True)
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None, from_command_line: bool | None = None) -> int:
    """`from_command_line` (default: `argv is None`): this process is the command itself, which may
    start again with the MKL vendor shim preloaded."""
    args, not_used = parse_server_args(argv)
    if args.mkl_vendor_shim and (argv is None if from_command_line is None else from_command_line):
        reexec_with_shim()
    try:
        check_model_dir(args.model_path, "--model-path")
        resolve_device(args.device)  # a CUDA request on a machine without that GPU stops before loading
    except SlimeError as e:
        print(f"slime serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not_used:
        logger.warning("SGLang server options accepted but not used by this engine: %s", "; ".join(not_used))
    set_hub_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.parent_pid:
        start_parent_watchdog(args.parent_pid)
    configure_torch_threads(server_threads(args))
    # The worker thread and the event loop share the GIL; hand it over quickly.
    sys.setswitchinterval(0.001)
    state = EngineState(args)
    config = uvicorn.Config(
        create_app(state),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="on",
        # a rollout opens hundreds of connections at once, and keeps them between rollouts
        timeout_keep_alive=120,
        backlog=4096,
    )
    _Server(config, state).run()
    state.scheduler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
