"""The batch the scheduler's worker decodes: its rows and KV state, what one decode step records,
prefilling rows into it, dropping finished ones, and the `min_new_tokens` stop-token suppression.

Everything here runs on the worker thread and touches no queue: the scheduler (slime.engine.scheduler)
decides when rows join, leave or are delivered, and holds the locks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from slime.engine.model_runner import ModelRunner
from slime.engine.request import Req, check_stop_strings, input_logprobs
from slime.engine.sampling import BatchSampler


@dataclass
class RunningBatch:
    """The batch the worker is decoding: its KV state, rows (finished ones until compaction),
    sampler, min_new_tokens suppression table and how many rows still generate."""

    state: Any
    rows: list[Req]
    sampler: BatchSampler
    suppress_ids: list | None
    alive: int

    def suppress(self, vocab: int) -> torch.Tensor | None:
        """This step's mask of stop tokens that rows under their `min_new_tokens` may not draw."""
        if self.suppress_ids is None:
            return None
        return suppress_mask(self.rows, self.suppress_ids, vocab)

    def compact(self, runner: ModelRunner, tokens_t: torch.Tensor) -> torch.Tensor:
        """Drop the finished rows (KV, sampler, suppression table); returns `tokens_t` of the rows kept."""
        keep = compaction_order([r.finish_reason is None for r in self.rows])
        runner.select_rows(self.state, keep)
        self.sampler.select(keep)
        tokens_t = tokens_t.index_select(0, torch.tensor(keep, dtype=torch.long))
        self.rows = [self.rows[i] for i in keep]
        if self.suppress_ids is not None:
            self.suppress_ids = suppress_table(self.rows)
        return tokens_t

    def grow(self, rows: list[Req], new_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Take the rows `add_rows` returned (the batch's own, then those that joined); returns the
        logits of every row."""
        added = len(rows) - len(self.rows)
        self.rows = rows
        if added:
            logits = torch.cat([logits, new_logits], dim=0)
            self.alive += added
            self.sampler._set_rows(self.rows)
            self.suppress_ids = suppress_table(self.rows)
        return logits


def add_rows(
    runner: ModelRunner,
    state: Any,
    rows: list[Req],
    new: list[Req],
    version: str,
    deliver: Callable[[list[Req]], None],
) -> tuple[list[Req], torch.Tensor] | None:
    """Prefill `new` into the batch `state` after its `rows`; `deliver` new rows with nothing to
    generate. Returns (the batch's rows now, logits [k, V] of the k new rows that stay), or
    None when the batch cannot take rows (nothing changed)."""
    # Requests with nothing to generate (max_new_tokens reached, e.g. 0) still get a prefill
    # when they asked for input log-probs.
    need_input_lp = [r.return_logprob and r.logprob_start_len >= 0 and r.input_logprobs is None for r in new]
    max_new = max(r.max_new_tokens - len(r.output_ids) for r in new)
    prompts = [r.input_ids + r.output_ids for r in new]
    got = runner.add_rows(state, prompts, max_new, full_logits=any(need_input_lp))
    if got is None:
        return None
    last, full, cached = got
    for r, c in zip(new, cached, strict=True):
        r.weight_version = version
        r.cached_tokens = c
        r.kv_epoch = runner.weights_epoch
    if full is not None:
        for i, r in enumerate(new):
            if need_input_lp[i]:
                r.input_logprobs, r.input_top_logprobs = input_logprobs(full[i], r)
        del full
    done_now = [r for r in new if len(r.output_ids) >= r.max_new_tokens]
    for r in done_now:
        r.finish_reason = {"type": "length", "length": r.max_new_tokens}
    if not done_now:
        return rows + new, last
    deliver(done_now)
    staying = [i for i, r in enumerate(new) if not r.finished]
    if not rows and not staying:
        return [], last[:0]
    runner.select_rows(state, list(range(len(rows))) + [len(rows) + i for i in staying])
    return rows + [new[i] for i in staying], last.index_select(0, torch.tensor(staying, dtype=torch.long))


def record_step(
    rows: list[Req],
    tokens: list[int],
    logprobs: list[float],
    tokenizer,
    tops: dict[int, tuple[list[float], list[int]]] | None = None,
) -> list[Req]:
    """Append each running row's sampled token (and its top-k log-probs, `tops` by row, for the rows
    that asked); returns the rows this step finished."""
    newly: list[Req] = []
    for i, r in enumerate(rows):
        if r.finish_reason is not None:  # finished earlier, waiting for compaction
            continue
        t = tokens[i]
        if tops is not None and i in tops:  # before the token: a streaming reader never sees it without them
            r.output_top_logprobs.append(tops[i])
        r.output_logprobs.append(logprobs[i])
        r.output_ids.append(t)
        n = len(r.output_ids)
        p = r.params
        if n >= p.min_new_tokens:
            if t in r.stop_ids:
                r.finish_reason = {"type": "stop", "matched": t}
            elif p.stop:
                check_stop_strings(r, tokenizer)
        if r.finish_reason is None and n >= r.max_new_tokens:
            r.finish_reason = {"type": "length", "length": r.max_new_tokens}
        if r.finish_reason is not None:
            newly.append(r)
        elif r.on_token is not None:  # a finished row is delivered instead
            r.on_token()
    return newly


# ---------------------------------------------------------------- min_new_tokens
def suppress_table(rows: list[Req]):
    """Per row, the stop tokens `min_new_tokens` still forbids; None when no row is under its minimum."""
    if not any(r.params.min_new_tokens > len(r.output_ids) for r in rows):
        return None
    return [sorted(r.stop_ids) for r in rows]


def suppress_mask(rows: list[Req], table, vocab: int) -> torch.Tensor | None:
    mask = None
    for i, r in enumerate(rows):
        if len(r.output_ids) < r.params.min_new_tokens and table[i]:
            if mask is None:
                mask = torch.zeros((len(rows), vocab), dtype=torch.bool)
            mask[i, table[i]] = True
    return mask


def compaction_order(alive: list[bool]) -> list[int]:
    """Which row each position takes when dead rows leave: the alive rows in the tail fill the
    holes in front, every other alive row keeps its position (so the native KV pool copies only
    the rows that move)."""
    n = sum(alive)
    tail = iter([i for i in range(n, len(alive)) if alive[i]])
    return [i if alive[i] else next(tail) for i in range(n)]
