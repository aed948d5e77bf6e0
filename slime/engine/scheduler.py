"""Request queue and worker thread of the built-in engine.

Requests wait in a FIFO queue. One worker thread (the HTTP server's event loop stays free to take
requests in) runs up to `max_running_requests` of them as one batch: a prefill, then batched
decode steps. Rows finish independently and leave the batch. Continuous batching: requests that
arrive meanwhile join the running batch between decode steps; admission stops while a control
operation, pause or abort is pending. KV budget (`max_total_tokens`, from `--max-total-tokens` or
`--mem-fraction-static`): a request is admitted only if, with it, rows x the largest
`prompt + max_new_tokens` stays within the budget (one that could never fit gets a 400 from the
server). Control operations (weight updates, flush, memory release) run on this thread between
batches, so weights never change inside one unless a client asked for it (`pause_generation`
mode `in_place`, then an update with `flush_cache: false`).

Pause modes (SGLang's): `abort` aborts every request and pauses; `retract` puts running requests
back at the front of the queue (their KV is dropped, what they generated is kept and prefilled
again on continue); `in_place` freezes the running batch with its KV cache. While frozen in place,
control operations that drop the KV cache (flush, release, an update with `flush_cache: true`)
first retract the frozen batch.

Bursts (a rollout sends all its samples at once) are coalesced: while requests stream in faster
than one per BURST_GAP_S and the queue is longer than the running batch, the worker waits for the
burst to land and takes it in one prefill (`_settle_burst`). Between two decode steps the worker
checks one flag (`_interrupt`), so aborts and pauses cost nothing while there are none.

What happens to the running batch itself (prefilling rows into it, recording a decode step, dropping
finished rows, min_new_tokens suppression) is slime.engine.running_batch's.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from slime.engine.model_runner import ModelRunner
from slime.engine.request import Req
from slime.engine.running_batch import RunningBatch, add_rows, record_step, suppress_table
from slime.engine.sampling import BatchSampler
from slime.runtime.core_lending import EngineLending

logger = logging.getLogger(__name__)

# burst coalescing (Scheduler._settle_burst): arrivals closer than this belong to one burst
BURST_GAP_S = 0.002
BURST_MAX_WAIT_S = 0.5


class _Retract(Exception):
    """Raised inside a batch to put its rows back into the queue."""


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_running_requests: int = 256,
        batch_wait_s: float = 0.0,
        seed: int = 0,
        deliver: Callable[[list[Req]], None] | None = None,
        weight_version: str = "default",
        step_delay_s: float = 0.0,
        compact_fraction: float = 0.1,
        continuous: bool = True,
        max_total_tokens: int | None = None,
        lending: EngineLending | None = None,
    ):
        # disaggregated on the CPU: this engine's cores serve a trainer rank while it has nothing to run
        self.lending = lending
        # KV budget in token positions of the padded batch cache (None: only max_running_requests)
        self.max_total_tokens = max_total_tokens
        self.peak_kv_tokens = 0  # the most the running batch ever reserved (rows x longest need)
        self.peak_rows = 0
        # continuous batching: waiting requests join the running batch between decode steps
        self.continuous = continuous
        self.step_delay_s = step_delay_s
        # finished rows are dropped from a running batch once they are this fraction of it
        self.compact_fraction = compact_fraction
        self.runner = runner
        self.max_running = max(1, int(max_running_requests))
        self.batch_wait_s = batch_wait_s
        self.deliver = deliver or (lambda reqs: None)
        self.weight_version = weight_version
        self.num_weight_updates = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._cv = threading.Condition()
        self._waiting: deque[Req] = deque()
        self._running: list[Req] = []
        self._controls: deque[tuple[Callable[[], Any], concurrent.futures.Future, bool]] = deque()
        self._abort_rids: set[str] = set()
        self._abort_all = False
        self._pause_mode: str | None = None
        self._released = False
        self._interrupt = False
        self._stopped = False
        self._last_submit = 0.0
        self._thread = threading.Thread(target=self._loop, name="engine-worker", daemon=True)
        self.batches_run = 0
        self.rows_run = 0
        self.tokens_generated = 0
        self.busy_s = 0.0

    # ---------------------------------------------------------------- public, any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._interrupt = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, reqs: list[Req], max_waiting: int | None = None) -> bool:
        """Queue `reqs`; False (nothing queued) when that would leave more than `max_waiting` waiting
        (an empty queue takes any batch: it could never fit otherwise)."""
        with self._cv:
            if max_waiting is not None and self._waiting and len(self._waiting) + len(reqs) > max_waiting:
                return False
            self._waiting.extend(reqs)
            self._last_submit = time.perf_counter()
            self._cv.notify_all()
        return True

    def stats(self) -> dict:
        return {
            "batches_run": self.batches_run,
            "rows_run": self.rows_run,
            "tokens_generated": self.tokens_generated,
            "busy_s": round(self.busy_s, 4),
            "max_total_num_tokens": self.max_total_tokens,
            "peak_kv_tokens": self.peak_kv_tokens,
            "peak_running_requests": self.peak_rows,
        }

    @staticmethod
    def _reserved(needs: list[int]) -> int:
        return len(needs) * max(needs, default=0)

    def _take_fitting(self, running: list[Req], limit: int) -> list[Req]:
        """Pop up to `limit` waiting requests, in order, while the batch stays within the KV budget.
        Call with `_cv` held. An empty batch always takes its first request (the server refused
        any request that could not fit alone)."""
        needs = [r.kv_need() for r in running if r.finish_reason is None]
        taken: list[Req] = []
        while self._waiting and len(taken) < limit:
            need = self._waiting[0].kv_need()
            if self.max_total_tokens is not None and needs and self._reserved(needs + [need]) > self.max_total_tokens:
                break  # FIFO: a later, smaller request does not overtake it
            needs.append(need)
            taken.append(self._waiting.popleft())
        if needs:
            self.peak_kv_tokens = max(self.peak_kv_tokens, self._reserved(needs))
            self.peak_rows = max(self.peak_rows, len(needs))
        return taken

    def load(self) -> dict:
        with self._cv:
            waiting = list(self._waiting)
            # a finished row stays in the batch list until the step that drops it; its answer is
            # already delivered, so it is no longer load
            running = [r for r in self._running if r.finish_reason is None]
        reqs = waiting + running
        load: dict[str, int | float] = {
            "num_reqs": len(reqs),
            "num_tokens": sum(r.num_tokens() for r in reqs),
            "num_waiting_reqs": len(waiting),
            "num_running_reqs": len(running),
        }
        if self.max_total_tokens:
            load["token_usage"] = round(self._reserved([r.kv_need() for r in running]) / self.max_total_tokens, 4)
        return load

    def abort(self, rids: list[str] | None = None, abort_all: bool = False) -> int:
        """Abort waiting requests now and running ones at their next decode step.

        Returns how many requests were hit (waiting + running)."""
        aborted: list[Req] = []
        with self._cv:
            running = [r for r in self._running if r.finish_reason is None]
            if abort_all:
                aborted = list(self._waiting)
                self._waiting.clear()
                hit = len(running)
                if running:
                    self._abort_all = True
            else:
                wanted = set(rids or [])
                keep: deque[Req] = deque()
                for r in self._waiting:
                    (aborted if r.rid in wanted else keep).append(r)
                self._waiting = keep
                running_hit = wanted & {r.rid for r in running}
                hit = len(running_hit)
                self._abort_rids |= running_hit
            if hit:
                self._interrupt = True
            self._cv.notify_all()
        for r in aborted:
            r.finish_reason = {"type": "abort", "message": "aborted by request"}
        if aborted:
            self._safe_deliver(aborted)
        return len(aborted) + hit

    def pause(self, mode: str = "abort") -> None:
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        with self._cv:
            self._pause_mode = mode
            self._interrupt = True
            self._cv.notify_all()
        if mode == "abort":
            self.abort(abort_all=True)

    def resume(self) -> None:
        with self._cv:
            self._pause_mode = None
            self._cv.notify_all()

    @property
    def paused(self) -> str | None:
        return self._pause_mode

    @property
    def released(self) -> bool:
        return self._released

    def run_control(self, fn: Callable[[], Any], *, needs_idle: bool = True) -> concurrent.futures.Future:
        """Run `fn` on the worker thread between batches. `needs_idle=False` operations may also
        run while a batch is frozen by an in-place pause (the batch keeps its KV cache)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._controls.append((fn, fut, needs_idle))
            self._interrupt = True
            self._cv.notify_all()
        return fut

    def set_released(self, released: bool) -> None:
        """Called from a control operation (worker thread)."""
        with self._cv:
            self._released = released
            self._cv.notify_all()

    # ---------------------------------------------------------------- worker
    def _can_start_batch(self) -> bool:
        return bool(self._waiting) and self._pause_mode is None and not self._released

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and not self._controls and not self._can_start_batch():
                    if self.lending is not None:
                        self.lending.idle()
                    self._cv.wait()
                if self._stopped:
                    break
                controls = list(self._controls)
                self._controls.clear()
            if self.lending is not None:
                self.lending.busy()
            if controls:
                for fn, fut, _ in controls:
                    self._run_one_control(fn, fut)
                continue
            if self.batch_wait_s > 0:
                self._gather_wait()
            with self._cv:
                if not self._can_start_batch():
                    continue
                batch = self._take_fitting([], self.max_running)
                self._running = batch
                self._interrupt = bool(
                    self._controls or self._abort_all or self._abort_rids or self._pause_mode or self._stopped
                )
            t0 = time.perf_counter()
            try:
                self._run_batch(batch)
            except _Retract:
                pass
            except BaseException as e:
                logger.exception("batch of %d requests failed", len(batch))
                failed = [r for r in batch if not r.finished]
                for r in failed:
                    r.error = e
                    r.finish_reason = {"type": "abort", "message": f"engine error: {type(e).__name__}: {e}"}
                self._safe_deliver(failed)
            finally:
                self.busy_s += time.perf_counter() - t0
                self.rows_run += len(batch)
                with self._cv:
                    self._running = []
                    self._abort_rids.clear()
                    self._abort_all = False
        # stopping: fail what is left
        with self._cv:
            left = list(self._waiting) + [r for r in self._running if not r.finished]
            self._waiting.clear()
            controls = list(self._controls)
            self._controls.clear()
        for r in left:
            r.finish_reason = {"type": "abort", "message": "server shutting down"}
        if left:
            self._safe_deliver(left)
        for _, fut, _ in controls:
            fut.set_exception(RuntimeError("server shutting down"))

    def _settle_burst(self, alive: int) -> bool:
        """A rollout sends all its samples at once, and the HTTP thread takes them in one by one
        (~0.2 ms each here). While they are still streaming in and the queue is longer than the
        running batch, the worker waits instead of decoding: the cores go to taking the burst in,
        and the burst joins the batch in one prefill and decodes in step, rather than in pieces
        that start (and finish) a few steps apart. A quiet gap of BURST_GAP_S ends the wait, and
        so do a full batch, an interrupt or BURST_MAX_WAIT_S. Returns whether it waited.
        (Measured side by side, 3 runs each: +3% full batch, +5% on bench/rollout.py's workload.)"""
        deadline = time.perf_counter() + BURST_MAX_WAIT_S
        waited = False
        with self._cv:
            while (
                len(self._waiting) > alive
                and alive + len(self._waiting) < self.max_running
                and not self._interrupt
                and time.perf_counter() - self._last_submit < BURST_GAP_S
                and time.perf_counter() < deadline
            ):
                waited = True
                self._cv.wait(timeout=BURST_GAP_S)
        return waited

    def _gather_wait(self) -> None:
        """Give requests that are arriving right now a moment to join this batch."""
        deadline = time.perf_counter() + self.batch_wait_s
        last = -1
        while True:
            with self._cv:
                n = len(self._waiting)
                if n >= self.max_running or n == last or self._controls:
                    return
                last = n
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    return
                self._cv.wait(timeout=min(remaining, 0.002))

    @staticmethod
    def _run_one_control(fn, fut) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001
            fut.set_exception(e)

    def _safe_deliver(self, reqs: list[Req]) -> None:
        reqs = [r for r in reqs if not r.delivered]
        if not reqs:
            return
        for r in reqs:
            r.delivered = True
        try:
            self.deliver(reqs)
        except Exception:
            logger.exception("delivering %d results failed", len(reqs))

    # ---------------------------------------------------------------- one batch
    def _admit(self, batch: list[Req], rows: list[Req], alive: int) -> list[Req]:
        """Continuous batching: take waiting requests into the running batch (between decode steps)."""
        with self._cv:
            if self._interrupt or not self._can_start_batch():
                return []
            n = min(self.max_running - alive, len(self._waiting))
            if n <= 0:
                return []
            new = self._take_fitting(rows, n)
            if not new:
                return []
            self._running = [r for r in rows if r.finish_reason is None] + new
        batch.extend(new)  # the caller's list: failures and stats see admitted rows too
        return new

    def _run_batch(self, batch: list[Req]) -> None:
        runner = self.runner
        self.batches_run += 1
        state = runner.new_batch()
        got = add_rows(runner, state, [], list(batch), self.weight_version, self._safe_deliver)
        assert got is not None, "an empty batch always takes its first rows"
        rows, logits = got
        if not rows:
            return
        run = RunningBatch(
            state,
            rows,
            BatchSampler(rows, runner.vocab_size, self.generator),
            suppress_table(rows),
            alive=len(rows),
        )
        steps_since_admit = 0
        while True:
            tokens_t, logprobs_t = run.sampler.sample(logits, run.suppress(logits.shape[1]))
            newly = record_step(
                run.rows, tokens_t.tolist(), logprobs_t.tolist(), runner.tokenizer, run.sampler.last_top
            )
            self.tokens_generated += run.alive
            if self._interrupt:
                newly += self._handle_interrupt(run.rows)
            if newly:
                if runner.prefix_cache is not None:
                    self._remember(run.rows, newly, state)
                self._safe_deliver(newly)
                run.alive -= len(newly)
                if run.alive <= 0:
                    break
                tokens_t = self._maybe_compact(run, tokens_t)
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            logits = runner.decode(state, tokens_t)
            steps_since_admit += 1
            settled = bool(self._waiting) and self.continuous and self._settle_burst(run.alive)
            if (
                self._waiting
                and self.continuous
                and run.alive < self.max_running
                and (settled or steps_since_admit >= 4 or len(self._waiting) >= self.max_running - run.alive)
            ):
                new = self._admit(batch, run.rows, run.alive)
                if new:
                    steps_since_admit = 0
                    logits = self._join(run, batch, new, logits)

    def _maybe_compact(self, run: RunningBatch, tokens_t: torch.Tensor) -> torch.Tensor:
        """Finished rows leave the batch when enough of them pile up: each compaction moves KV
        rows, so one at a time is slower than carrying a few dead rows along."""
        if len(run.rows) - run.alive >= self.compact_fraction * len(run.rows):
            tokens_t = run.compact(self.runner, tokens_t)
        with self._cv:
            self._running = [r for r in run.rows if r.finish_reason is None]
        return tokens_t

    def _join(self, run: RunningBatch, batch: list[Req], new: list[Req], logits: torch.Tensor) -> torch.Tensor:
        """Prefill admitted requests into the running batch; returns the logits of every row."""
        got = add_rows(self.runner, run.state, run.rows, new, self.weight_version, self._safe_deliver)
        if got is None:  # cannot merge this cache type: back to the front of the queue
            self.continuous = False
            with self._cv:
                for r in reversed(new):
                    self._waiting.appendleft(r)
                self._running = [r for r in run.rows if r.finish_reason is None]
            for r in new:
                batch.remove(r)
            return logits
        return run.grow(*got, logits)

    def _remember(self, rows: list[Req], leaving: list[Req], state) -> None:
        """Rows leaving the batch keep their KV in the prefix cache (if all of it is from the
        current weights): input + output except the last sampled token, whose KV was never computed."""
        index = {id(r): i for i, r in enumerate(rows)}
        for r in leaving:
            i = index.get(id(r))
            if i is not None and r.output_ids and r.kv_epoch == self.runner.weights_epoch:
                self.runner.remember(state, i, r.input_ids + r.output_ids[:-1])

    # ---------------------------------------------------------------- interrupts
    def _handle_interrupt(self, rows: list[Req]) -> list[Req]:
        """Aborts, pauses and in-place control operations, checked between decode steps.

        Returns the rows it finished (aborted). While the batch is frozen by an in-place pause
        this does not return; rows aborted meanwhile are delivered right away.
        """
        aborted: list[Req] = []
        while True:
            with self._cv:
                abort_all, abort_rids = self._abort_all, set(self._abort_rids)
                self._abort_all = False
                self._abort_rids.clear()
                mode = self._pause_mode
                stopped = self._stopped
                controls = []
                if mode == "in_place":
                    controls = list(self._controls)
                    self._controls.clear()
            newly = []
            for r in rows:
                if r.finish_reason is not None:
                    continue
                if stopped:
                    r.finish_reason = {"type": "abort", "message": "server shutting down"}
                elif abort_all or r.rid in abort_rids:
                    r.finish_reason = {"type": "abort", "message": "aborted by request"}
                else:
                    continue
                newly.append(r)
            aborted += newly
            if stopped or all(r.finish_reason is not None for r in rows):
                for c in reversed(controls):  # not run here: back to the between-batches loop
                    with self._cv:
                        self._controls.appendleft(c)
                break
            if mode == "retract" or (mode == "in_place" and any(c[2] for c in controls)):
                self._retract(rows, controls)  # raises _Retract
            if mode != "in_place":
                break
            if newly:
                self._safe_deliver(newly)  # frozen: answer aborted requests now
            for fn, fut, _ in controls:
                self._run_one_control(fn, fut)
            with self._cv:
                if self._pause_mode == "in_place" and not (
                    self._controls or self._abort_all or self._abort_rids or self._stopped
                ):
                    self._cv.wait()
        with self._cv:
            self._interrupt = bool(
                self._controls or self._abort_all or self._abort_rids or self._pause_mode or self._stopped
            )
        return aborted

    def _retract(self, rows: list[Req], controls) -> None:
        """Put unfinished rows back at the front of the queue and leave the batch."""
        self._safe_deliver([r for r in rows if r.finish_reason is not None])
        back = [r for r in rows if r.finish_reason is None]
        with self._cv:
            # control operations already taken off the queue go back, ahead of anything new
            for c in reversed(controls):
                self._controls.appendleft(c)
            for r in reversed(back):
                self._waiting.appendleft(r)
            self._running = []
            self._cv.notify_all()
        raise _Retract()
