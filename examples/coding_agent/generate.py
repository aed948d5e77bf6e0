"""A coding agent: the model runs Python in a sandbox while it writes its solution.

Used as `--custom-generate-function-path examples.coding_agent.generate.generate`. Each model
turn stops at `</code>` (a stop string, kept in the output tokens). A turn that ends in
`<code>PROGRAM</code>` has PROGRAM run in the framework's sandbox (`slime.sandbox`:
bubblewrap namespaces, only /usr and Python visible, a throw-away scratch directory, no network,
CPU / memory / process / output / wall-time limits) and its output appended as
`<output>...</output>`; those tokens are the tool's, so they are masked out of the loss
(loss_mask 0, log-prob 0.0). Any other turn (the model ends with EOS, or runs out of tokens) is
its final answer. `examples/coding_agent/reward.py` grades that answer against the task's tests.

Settings: the `--sandbox-*` options (the `--rm-type code` limits, `--sandbox-allow-unisolated`
included) apply to the tool runs too; the
environment variable CODING_AGENT_MAX_TURNS (default 3) bounds the model turns.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from argparse import Namespace
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.rollout.multi_turn import Trajectory, run_multi_turn
from slime.sandbox import SandboxLimits, SandboxResult, run_python
from slime.utils.types import Sample

STOP_STRINGS = ("</code>",)
MAX_OUTPUT_CHARS = 240  # the tiny model's whole context is 256 tokens; real models can take more
_CODE = re.compile(r"<code>(.*?)</code>", re.DOTALL)
_WHOLE_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)\n?```", re.DOTALL)
_slots: dict[int, threading.BoundedSemaphore] = {}


def max_turns() -> int:
    return int(os.environ.get("CODING_AGENT_MAX_TURNS", "3"))


def tool_call(text: str) -> str | None:
    """The program of a turn that ended in `<code>...</code>` (unwrapped if the whole program is
    one fenced block), or None when the turn ended any other way: then it is the final answer.

    Generation stops at the first `</code>`, so a turn with a complete block ended with it (the
    last token may carry a few more characters: byte-level BPE merges do not respect the tag)."""
    blocks = _CODE.findall(text)
    if not blocks:
        return None
    fenced = _WHOLE_FENCE.fullmatch(blocks[-1].strip())
    return fenced.group(1) if fenced else blocks[-1]


def sandbox_limits(args: Namespace) -> SandboxLimits:
    return SandboxLimits.from_args(args)


def sandbox_slot(args: Namespace) -> threading.BoundedSemaphore:
    """At most `--sandbox-concurrency` sandboxed programs at once, tool runs and grading together
    (a rollout generates many samples concurrently; unbounded, they would swamp the CPUs)."""
    n = args.sandbox_concurrency
    return _slots.setdefault(n, threading.BoundedSemaphore(n))


async def run_sandboxed(args: Namespace, code: str) -> SandboxResult:
    """`run_python` blocks: run it in a worker thread, holding a sandbox slot."""

    def job() -> SandboxResult:
        with sandbox_slot(args):
            return run_python(code, limits=sandbox_limits(args))

    return await asyncio.to_thread(job)


def format_output(result: SandboxResult) -> str:
    """What the model sees: stdout, then stderr, then why the run failed; the tail when long."""
    text = result.stdout + result.stderr
    if result.timed_out or (result.returncode or 0) < 0:  # killed: stderr does not say why
        text += f"\n[{result.reason}]"
    text = text.strip()
    if len(text) > MAX_OUTPUT_CHARS:
        text = "..." + text[-MAX_OUTPUT_CHARS:]
    return f"\n<output>\n{text}\n</output>\n"


@lru_cache(maxsize=8)
def _context_length(hf_checkpoint: str) -> int | None:
    try:
        return json.loads((Path(hf_checkpoint) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None


def context_length(args: Namespace) -> int | None:
    """Prompt + response must fit the model's context, or the engine refuses the request (HTTP 400)."""
    return _context_length(str(args.hf_checkpoint)) if args.hf_checkpoint else None


async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """One coding-agent trajectory for `sample` (slime's custom generate signature)."""

    async def env_step(text: str, trajectory: Trajectory) -> str | None:
        code = tool_call(text)
        if code is None:
            return None
        if trajectory.turns_left == 0:  # no turn left to read the output: do not run it
            return ""
        result = await run_sandboxed(args, code)
        trajectory.sample.metadata.setdefault("tool_runs", []).append(
            {"ok": result.ok, "reason": result.reason, "wall_s": round(result.wall_s, 3)}
        )
        return format_output(result)

    params = dict(sampling_params)
    params["stop"] = list(dict.fromkeys([*(params.get("stop") or []), *STOP_STRINGS]))
    params["no_stop_trim"] = True  # `</code>` stays in the tokens the model is trained on
    return await run_multi_turn(
        args, sample, params, env_step, max_turns=max_turns(), max_total_tokens=context_length(args)
    )
