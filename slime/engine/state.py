"""What one engine server holds: the model runner, the scheduler's worker thread, weight-update
groups, and the KV token budget; and the few operations every route shares (run requests,
run a control operation between batches, bump the weight version)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slime import __version__
from slime.engine.lora_weights import LoraBase
from slime.engine.model_runner import ModelRunner
from slime.engine.request import Req, parse_generate, result_of
from slime.engine.sampling import BadRequest
from slime.engine.scheduler import Scheduler
from slime.runtime.core_lending import EngineLending


def kv_token_budget(args: argparse.Namespace, runner: ModelRunner) -> int | None:
    """`--max-total-tokens`, or what `--mem-fraction-static` of the device's memory leaves for the
    KV cache after the weights (SGLang's rule: the GPU's memory on CUDA, RAM on the CPU); None: no
    budget. On a GPU, a budget larger than the card (or than it has free) stops here."""
    if args.max_total_tokens is not None:
        if args.max_total_tokens < 1:
            raise SystemExit(f"--max-total-tokens must be >= 1, got {args.max_total_tokens}")
        runner.check_memory(
            f"--max-total-tokens {args.max_total_tokens}",  # on a GPU: does it fit the card
            runner.weight_bytes() + args.max_total_tokens * runner.kv_bytes_per_token(),
        )
        return int(args.max_total_tokens)
    if args.mem_fraction_static is None:
        return None
    if not 0.0 < args.mem_fraction_static <= 1.0:
        raise SystemExit(f"--mem-fraction-static must be in (0, 1], got {args.mem_fraction_static}")
    # the GPU's memory on CUDA (SGLang's meaning), the machine's RAM on the CPU
    runner.check_memory(
        f"--mem-fraction-static {args.mem_fraction_static}", args.mem_fraction_static * runner.memory_bytes()
    )
    free = args.mem_fraction_static * runner.memory_bytes() - runner.weight_bytes()
    tokens = int(free // runner.kv_bytes_per_token())
    if tokens < runner.context_length:
        raise SystemExit(
            f"--mem-fraction-static {args.mem_fraction_static} leaves room for {max(tokens, 0)} KV "
            f"tokens, less than one request of the context length {runner.context_length}"
        )
    return tokens


class QueueFull(Exception):
    """The waiting queue is at its cap (HTTP 503)."""


def batch_size(body: Any) -> int:
    """How many prompts a /generate body holds (1 for a single request), before parsing it."""
    if isinstance(body, dict):
        for key in ("input_ids", "text"):
            v = body.get(key)
            if isinstance(v, list) and v and (key == "text" or isinstance(v[0], list)):
                return len(v)
    return 1


class EngineState:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        t0 = time.perf_counter()
        self.runner = ModelRunner(
            args.model_path,
            dtype=args.dtype,
            context_length=args.context_length,
            tokenizer_path=args.tokenizer_path,
            trust_remote_code=args.trust_remote_code,
            share_prefix=not args.disable_radix_cache,
            prefix_cache_tokens=args.prefix_cache_tokens,
            model_impl=args.model_impl,
            device=args.device,
        )
        self.model_path = args.model_path
        self.max_total_tokens = kv_token_budget(args, self.runner)
        self.scheduler = Scheduler(
            self.runner,
            max_running_requests=args.max_running_requests,
            max_total_tokens=self.max_total_tokens,
            batch_wait_s=args.batch_wait_ms / 1000.0,
            seed=args.random_seed,
            deliver=self._deliver,
            weight_version=args.weight_version,
            step_delay_s=args.step_delay_ms / 1000.0,
            lending=EngineLending.from_env(),
        )
        self.scheduler.start()
        self.load_time = time.perf_counter() - t0
        self.release_tags: list[str] = []
        # torch.distributed groups for update_weights_from_distributed, by group_name
        self.weight_groups: dict[str, Any] = {}
        self.weight_group_locks: dict[str, asyncio.Lock] = {}
        self.lora = LoraBase()  # a LoRA run's base weights, for adapter-only updates (slime.engine.lora_weights)
        # large request bodies are parsed (JSON, and tokenizing any text) here, one at a time, not on
        # the event loop: a megabyte of text takes a tokenizer seconds, which the loop spends serving
        # every other client (the tokenizer releases the GIL)
        self.parse_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parse")

    # ---------------------------------------------------------------- requests
    def parse_generate(self, body: Any) -> tuple[list[Req], bool]:
        n = batch_size(body)
        if n > self.args.max_batch_request_size:
            raise BadRequest(
                f"a batch of {n} prompts is over --max-batch-request-size {self.args.max_batch_request_size}; split it"
            )
        return parse_generate(body, self.runner, self.max_total_tokens)

    async def run(self, reqs: list[Req]) -> list[dict]:
        """Submit `reqs` to the worker and wait for their answers (on this event loop).
        QueueFull when the waiting queue is at --max-queued-requests; cancelled (the client
        left), the requests are aborted."""
        self.submit(reqs)
        return await self.wait(reqs)

    def submit(self, reqs: list[Req]) -> None:
        """Queue `reqs`, each with a future on the running loop that gets its answer (`wait`);
        QueueFull when the waiting queue is at --max-queued-requests."""
        loop = asyncio.get_running_loop()
        for r in reqs:
            r.loop, r.future = loop, loop.create_future()
        if not self.scheduler.submit(reqs, self.args.max_queued_requests):
            raise QueueFull(
                f"the engine's queue is full (--max-queued-requests {self.args.max_queued_requests}); retry later"
            )

    async def wait(self, reqs: list[Req]) -> list[dict]:
        """The answers of submitted `reqs`; cancelled (the client left), the requests are aborted."""
        try:
            return list(await asyncio.gather(*(r.future for r in reqs)))
        except asyncio.CancelledError:
            self.scheduler.abort(rids=[r.rid for r in reqs])
            raise

    def _deliver(self, reqs: list[Req]) -> None:
        """Called on the worker thread: hand each answer to the event loop that waits for it."""
        by_loop: dict[Any, list] = defaultdict(list)
        for r in reqs:
            if r.future is None:
                continue
            if r.error is not None:
                by_loop[r.loop].append((r.future, None, r.error))
            else:
                by_loop[r.loop].append(
                    (r.future, result_of(r, self.runner.tokenizer, self.scheduler.weight_version), None)
                )
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_resolve, items)

    # ---------------------------------------------------------------- control
    async def control(self, fn: Callable[[], Any], *, needs_idle: bool = True) -> Any:
        """Run `fn` on the worker thread between batches (weights never change inside one)."""
        return await asyncio.wrap_future(self.scheduler.run_control(fn, needs_idle=needs_idle))

    def bump_version(self, version: str | None) -> str:
        sch = self.scheduler
        sch.num_weight_updates += 1
        sch.weight_version = version if version is not None else str(sch.num_weight_updates)
        return sch.weight_version

    # ---------------------------------------------------------------- info
    def model_info(self) -> dict:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.runner.tokenizer_path,
            "is_generation": True,
            "weight_version": self.scheduler.weight_version,
            "model_type": getattr(self.runner.config, "model_type", None),
            "model_impl": self.runner.model_impl,
            "vocab_size": self.runner.vocab_size,
            "context_length": self.runner.context_length,
            "max_total_num_tokens": self.max_total_tokens,
            "preferred_sampling_params": None,
        }

    def server_info(self) -> dict:
        sch = self.scheduler
        info = {k: v for k, v in vars(self.args).items() if k not in ("api_key", "admin_api_key")}
        info.update(
            version=__version__,
            engine="slime-builtin",
            weight_version=sch.weight_version,
            lora_base_id=self.lora.base_id,  # its presence says: adapter-only updates are understood
            context_length=self.runner.context_length,
            max_total_num_tokens=self.max_total_tokens,
            model_path=self.model_path,
            paused=sch.paused,
            memory_released=sch.released,
            stats=dict(sch.stats(), **self._prefix_cache_stats()),
        )
        return info

    def _prefix_cache_stats(self) -> dict:
        pc = self.runner.prefix_cache
        if pc is None:
            return {"prefix_cache": None}
        return {
            "prefix_cache": {
                "entries": len(pc),
                "tokens": pc.num_tokens,
                "max_tokens": pc.max_tokens,
                "hits": pc.hits,
                "hit_tokens": pc.hit_tokens,
            }
        }


def _resolve(items) -> None:
    for fut, result, err in items:
        if fut.done():
            continue
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(result)
