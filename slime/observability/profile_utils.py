"""slime's torch profiler of a training rank (`slime.observability.profile_utils.TrainProfiler`).

With `--use-pytorch-profiler`, each `--profile-target` writes Chrome trace JSON (gzipped, torch's
`tensorboard_trace_handler`: `<--tensorboard-dir>/<target>_rank_<r>[_step_<s>].<time_ns>.pt.trace.json.gz`),
which Perfetto (ui.perfetto.dev), chrome://tracing and TensorBoard's profiler plugin open. A step
is one `train` call of this process (one rollout), counted from 0:

* `train_overall` (slime's default): one profiler over the rank's process, slime's schedule
  (wait `start - 1`, warm up 1, record `end - start` steps): everything the rank does in steps
  `start .. end - 1`, weight updates included; one trace when the window closes.
* `train_actor` / `train_log_probs`: only that phase (the optimizer steps; the old / reference
  log-prob passes) of each step in the window; one trace per step.

The per-phase wall-clock timers (`perf/*`, slime.observability.timer) are independent of this.
"""

from __future__ import annotations

import contextlib
import logging
from argparse import Namespace
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)


class TrainProfiler:
    def __init__(self, args: Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        self.step_index = 0  # train calls finished in this process
        self._overall: torch.profiler.profile | None = None
        if args.use_pytorch_profiler and "train_overall" in args.profile_target:
            start, end = args.profile_step_start, args.profile_step_end
            schedule = torch.profiler.schedule(
                wait=max(start - 1, 0), warmup=1 if start > 0 else 0, active=end - start, repeat=1
            )
            self._overall = _profiler(args, f"train_overall_rank_{rank}", schedule)

    def on_init_end(self) -> None:
        if self._overall is not None:
            self._overall.start()

    def step(self) -> None:
        """After each train call."""
        if self._overall is not None:
            self._overall.step()
            if self.step_index + 1 == self.args.profile_step_end:  # the window closed: its trace is written
                self._overall.stop()
                self._overall = None
        self.step_index += 1

    @contextlib.contextmanager
    def phase(self, target: str) -> Iterator[None]:
        """Trace this block when `target` is profiled and the current step is in the window."""
        a = self.args
        if not (
            a.use_pytorch_profiler
            and target in a.profile_target
            and a.profile_step_start <= self.step_index < a.profile_step_end
        ):
            yield
            return
        with _profiler(a, f"{target}_rank_{self.rank}_step_{self.step_index}", None):
            yield


def _profiler(args: Namespace, worker_name: str, schedule) -> torch.profiler.profile:
    logger.info("torch profiler %s: traces in %s", worker_name, args.tensorboard_dir)
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            args.tensorboard_dir, worker_name=worker_name, use_gzip=True
        ),
        record_shapes=True,
        with_stack=True,
        profile_memory=True,
        with_flops=True,
    )
