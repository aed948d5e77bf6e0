"""slime's memory recorder of a training rank (`--record-memory-history`, slime's
slime/observability/profile_utils.py), with `--memory-recorder memray`: a memray capture of the
rank's process (host memory: every allocation, with Python and native stacks), opened when the
rank starts and closed after the training step of rollout `--memory-snapshot-num-steps - 1`
(resumed past it: after the first step), as slime's. Like slime's it records only with
`--profile-target train_overall` (the default). The capture goes to
`<--memory-snapshot-dir>/memory_snapshot_time<t>_rank<r>_<--memory-snapshot-path>`; read it with
`memray stats FILE`, `memray flamegraph FILE`, or `memray.FileReader`.

`--memory-recorder torch` (slime's default) records CUDA memory snapshots: GPU-only, named at
start-up as not used (slime.arguments.logs).
"""

from __future__ import annotations

import logging
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class MemoryRecorder:
    def __init__(self, args: Namespace, rank: int) -> None:
        self.args = args
        self.path: Path | None = None
        self._tracker: Any = None
        if args.record_memory_history and args.memory_recorder == "memray" and "train_overall" in args.profile_target:
            self._start(rank)

    def _start(self, rank: int) -> None:
        import memray  # only here: an optional package (checked at parsing when asked for)

        a = self.args
        directory = Path(a.memory_snapshot_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"memory_snapshot_time{time.time()}_rank{rank}_{a.memory_snapshot_path}"
        self._tracker = memray.Tracker(file_name=str(self.path), native_traces=True)
        self._tracker.__enter__()
        logger.info("memray: recording rank %d's memory into %s", rank, self.path)

    @property
    def recording(self) -> bool:
        return self._tracker is not None

    def step(self, rollout_id: int) -> None:
        """After each training step (one rollout's `train`)."""
        if self.recording and rollout_id >= self.args.memory_snapshot_num_steps - 1:
            self.stop()

    def stop(self) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None
            logger.info("memray: capture written to %s", self.path)
