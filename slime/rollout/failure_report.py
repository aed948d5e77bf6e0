"""FAILED samples said once per distinct error, not once per sample.

A reward, hook or generate function that raises marks its sample FAILED with the error and the
traceback in `sample.metadata` (`slime.rollout.generation`). When a rollout (or an evaluation)
ends, `report_failures` prints one line per distinct error with how many samples it failed, and
appends the first traceback of each to `<run-dir>/failures.log`, whose path the line names: a
reward that raises on every sample is one line, not a traceback per group.
"""

from __future__ import annotations

import logging
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

from slime.utils.types import Sample

logger = logging.getLogger("slime")
FAILURES_LOG = "failures.log"


def failure_lines(samples: list[Any]) -> list[tuple[str, int, str]]:
    """(error, samples it failed, first traceback) per distinct error, most frequent first."""
    failed = [s for s in samples if s.status == Sample.Status.FAILED]
    counts = Counter(s.metadata.get("error", "no error recorded") for s in failed)
    first: dict[str, str] = {}
    for s in failed:
        first.setdefault(s.metadata.get("error", "no error recorded"), s.metadata.get("traceback") or "")
    return [(error, n, first[error]) for error, n in counts.most_common()]


def report_failures(args: Namespace, samples: list[Any], what: str) -> None:
    """One warning line per distinct error of `samples` (`what`: "rollout 3", "eval rollout 3")."""
    lines = failure_lines(samples)
    if not lines:
        return
    log = Path(args.run_dir) / FAILURES_LOG
    try:
        with open(log, "a", encoding="utf-8") as f:
            for error, n, tb in lines:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}: {n} sample(s): {error}\n{tb.rstrip()}\n")
        where = f"first traceback of each in {log}"
    except OSError as e:
        where = f"tracebacks could not be written to {log}: {e.strerror}"
    total = sum(n for _, n, _ in lines)
    logger.warning("%s: %d of %d samples FAILED (%s)", what, total, len(samples), where)
    for error, n, _ in lines:
        logger.warning("  %d x %s", n, error[:500])
