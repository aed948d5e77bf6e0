"""Helpers for the engine tests: start a server, reference values from a direct HF forward."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch


def start_engine(model_dir, *extra: str, log_dir: Path | None = None):
    from slime.ray.engine_process import EngineProcess

    log_path = (log_dir / "engine.log") if log_dir else None
    eng = EngineProcess.start(model_dir, num_threads=1, extra_args=["--random-seed", "0", *extra], log_path=log_path)
    try:
        eng.wait_until_healthy(timeout=120)
    except BaseException:
        eng.stop()
        raise
    return eng


def run_async(coro):
    """asyncio.run(coro), closing the loop's shared HTTP session (slime.utils.http_utils) at the end."""
    from slime.utils.http_utils import close_sessions

    async def wrapped():
        try:
            return await coro
        finally:
            await close_sessions()

    return asyncio.run(wrapped())


# ----------------------------------------------------------------------------------- reference
@torch.no_grad()
def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each output token from one forward pass over prompt + output."""
    ids = torch.tensor([prompt + output])
    logits = model(input_ids=ids).logits[0].float()
    t = 1.0 if temperature <= 1e-6 else temperature
    lp = torch.log_softmax(logits / t, dim=-1)
    n = len(prompt)
    return [lp[n - 1 + i, tok].item() for i, tok in enumerate(output)]


@torch.no_grad()
def reference_input_logprobs(model, prompt: list[int], start: int, temperature: float = 1.0) -> list:
    ids = torch.tensor([prompt])
    logits = model(input_ids=ids).logits[0].float()
    t = 1.0 if temperature <= 1e-6 else temperature
    lp = torch.log_softmax(logits / t, dim=-1)
    return [None if i == 0 else lp[i - 1, prompt[i]].item() for i in range(start, len(prompt))]


@torch.no_grad()
def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    out = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        t = int(logits.argmax())
        out.append(t)
        ids.append(t)
    return out
