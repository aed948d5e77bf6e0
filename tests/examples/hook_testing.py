"""Helpers for the example hooks' tests: a scripted stand-in for the engine's `/generate` (for
unit tests of generate hooks only) and the short training run every example's e2e test makes.

The random tiny model would almost never write a tool call, so the example hooks' trajectory
logic is tested against scripted model turns served on a loopback port in the built-in engine's
response shape; everything else they call (retrieval server, sandbox) is real.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from slime.utils.types import Sample


class ScriptedEngine:
    """Answers `/generate` with scripted turns in the built-in engine's response shape.

    Each call takes the next scripted text (the last one repeats), tokenizes it, cuts it at
    `max_new_tokens`, and reports finish_reason as the engine would: `stop` on EOS or on a
    stop string the text ends with (kept, as `no_stop_trim` does), else `length`. Log-probs are
    distinct per call and position so misalignment shows. Every request body and header is kept.
    """

    def __init__(self, tokenizer: Any, turns: list[str], weight_version: str = "3"):
        self.tokenizer, self.turns, self.weight_version = tokenizer, turns, weight_version
        self.requests: list[tuple[dict[str, Any], dict[str, str]]] = []
        self.outputs: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((body, dict(request.headers)))
        k = len(self.outputs)
        params = body["sampling_params"]
        ids = self.tokenizer.encode(self.turns[min(k, len(self.turns) - 1)], add_special_tokens=False)
        ids = ids[: params["max_new_tokens"]]
        text = self.tokenizer.decode(ids, skip_special_tokens=params.get("skip_special_tokens", False))
        matched = next((s for s in params.get("stop") or [] if text.endswith(s)), None)
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            finish = {"type": "stop", "matched": ids[-1]}
        elif matched is not None:
            finish = {"type": "stop", "matched": matched}
        else:
            finish = {"type": "length", "length": len(ids)}
        logprobs = [[-(k + 1) / 10 - j / 1000, t, None] for j, t in enumerate(ids)]
        out = {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "finish_reason": finish,
                "output_token_logprobs": logprobs,
                "weight_version": self.weight_version,
            },
        }
        self.outputs.append(out)
        return web.json_response(out)


async def serve(engine: ScriptedEngine, args: Namespace, coro_fn: Callable[[], Any]) -> Any:
    """Run `coro_fn()` while `engine` answers `/generate` on a free loopback port named on `args`."""
    app = web.Application()
    app.router.add_post("/generate", engine.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", runner.addresses[0][1]
    try:
        return await coro_fn()
    finally:
        await runner.cleanup()


def run_hook(
    generate: Callable, args: Namespace, engine: ScriptedEngine, sample: Sample, max_new_tokens: int | None = None
) -> Sample:
    """One call of a generate hook against `engine`, with the run's sampling parameters."""
    from slime.rollout.sglang_rollout import sampling_params_from_args

    params = sampling_params_from_args(args, evaluation=False)
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    return asyncio.run(serve(engine, args, lambda: generate(args, sample, params)))


def train_argv(example: str, model_dir: Path, run_dir: Path, rm_path: str | None = None) -> list[str]:
    """A short colocated run with `examples/<example>`'s generate hook, data and reward."""
    data = Path(__file__).resolve().parents[2] / "examples" / example / "data.jsonl"
    return [
        "--hf-checkpoint",
        str(model_dir),
        "--prompt-data",
        str(data),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--custom-generate-function-path",
        f"examples.{example}.generate.generate",
        "--custom-rm-path",
        rm_path or f"examples.{example}.reward.reward",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "32",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--colocate",
        "--run-dir",
        str(run_dir),
    ]
