"""Search-R1 style generation: the model searches a local retrieval server while it answers.

Used as `--custom-generate-function-path examples.search_r1.generate.generate`. Each model turn
stops at `</search>` or `</answer>` (stop strings, kept in the output tokens). A turn that ends in
`<search>QUERY</search>` gets the top passages from the retrieval server appended as
`<information>...</information>`; those tokens are the environment's, not the policy's, so they
are masked out of the loss (loss_mask 0, log-prob 0.0). A turn with `<answer>...</answer>` or
with no tag at all ends the trajectory. The token bookkeeping (exact engine tokens, per-turn
spans, routing-key header per trajectory) is the framework's `slime.rollout.multi_turn`.

Settings (environment variables, read at every call, so they reach the rollout process through
Ray's worker environment when set before `slime train` starts):
    SEARCH_R1_URL        retrieval server, default http://127.0.0.1:8765
    SEARCH_R1_MAX_TURNS  model turns per trajectory, default 3
    SEARCH_R1_TOPK       passages per search, default 1 (the tiny model's context is 256 tokens)
"""

from __future__ import annotations

import json
import os
import re
from argparse import Namespace
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.rollout.multi_turn import Trajectory, run_multi_turn
from slime.utils.http_utils import post
from slime.utils.types import Sample

DEFAULT_URL = "http://127.0.0.1:8765"
STOP_STRINGS = ("</search>", "</answer>")
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def retrieval_url() -> str:
    return os.environ.get("SEARCH_R1_URL", DEFAULT_URL).rstrip("/")


def max_turns() -> int:
    return int(os.environ.get("SEARCH_R1_MAX_TURNS", "3"))


def topk() -> int:
    return int(os.environ.get("SEARCH_R1_TOPK", "1"))


def parse_action(text: str) -> tuple[str, str] | None:
    """The turn's action, ("search", query) or ("answer", answer), or None when it has neither.

    Generation stops at the first closing tag, so the last complete tag of a turn is its action.
    """
    matches = list(_ACTION.finditer(text))
    if not matches:
        return None
    kind, content = matches[-1].group(1), matches[-1].group(2).strip()
    return kind, content


async def search(query: str, k: int | None = None) -> list[dict[str, Any]]:
    """Ask the retrieval server; a dead server raises (the sample is then FAILED, not silently wrong)."""
    answer = await post(
        f"{retrieval_url()}/retrieve", {"queries": [query], "topk": k or topk()}, max_retries=3, retry_interval=0.5
    )
    return list(answer["result"][0])


def format_information(passages: list[dict[str, Any]]) -> str:
    """The observation appended after a search. Passage text is stripped of angle brackets so
    retrieved text can never look like an action tag or an answer to the parser or the reward."""
    if not passages:
        body = "No results."
    else:
        body = " ".join(f"({i}) {p.get('title', '')}: {p['text']}" for i, p in enumerate(passages, 1))
    body = body.replace("<", " ").replace(">", " ")
    return f"\n<information>{body}</information>\n"


@lru_cache(maxsize=8)
def _context_length(hf_checkpoint: str) -> int | None:
    try:
        config = json.loads((Path(hf_checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("max_position_embeddings")


def context_length(args: Namespace) -> int | None:
    """Prompt + response must fit the model's context, or the engine refuses the request (HTTP 400)."""
    return _context_length(str(args.hf_checkpoint)) if args.hf_checkpoint else None


async def env_step(text: str, trajectory: Trajectory) -> str | None:
    action = parse_action(text)
    if action is None or action[0] == "answer":
        return None
    if trajectory.turns_left == 0:  # no turn left to read the results: do not search
        return ""
    query = action[1]
    passages = await search(query)
    trajectory.sample.metadata.setdefault("search_queries", []).append(query)
    return format_information(passages)


async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """One Search-R1 trajectory for `sample` (slime's custom generate signature)."""
    params = dict(sampling_params)
    params["stop"] = list(dict.fromkeys([*(params.get("stop") or []), *STOP_STRINGS]))
    params["no_stop_trim"] = True  # the closing tag stays in the tokens the model is trained on
    return await run_multi_turn(
        args, sample, params, env_step, max_turns=max_turns(), max_total_tokens=context_length(args)
    )
