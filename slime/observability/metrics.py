"""Run metrics: one JSON object per line in ``<run_dir>/metrics.jsonl``, optional TensorBoard and
Weights & Biases, and a one-line console summary per step.

Each line holds ``rollout_id`` (the step the caller passes), ``global_step`` (monotone across the
stages of one run: ``rollout_id + step_offset``), ``stage`` (when set), ``time`` (seconds since the
logger was created) and the metrics with slime's keys (``rollout/raw_reward``, ``train/pg_loss``,
``eval/<name>``, ``perf/rollout_time``, ...). Non-finite values are written as ``null``.

Several stages of one run (e.g. SFT then RL) append to the same file; the second stage's logger
continues the global step after the first (``step_offset=None`` works it out from the file). A
resumed stage continues its own global steps, and its first record supersedes the rows the
interrupted run wrote from that rollout on (past its last checkpoint): they move to
``metrics.superseded.jsonl``, so ``metrics.jsonl`` holds each rollout once.

All sinks are fed from ``MetricsLogger.log``: TensorBoard and wandb receive the same scalars (every
numeric, finite metric of the JSON record; strings and non-finite values are in the JSON only) at
the same step, the record's ``global_step``. ``MetricsLogger.from_args`` builds the logger of a
training stage from its arguments (``--use-tensorboard``, ``--tb-*``, ``--use-wandb``, ``--wandb-*``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import threading
import time
from argparse import Namespace
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime.observability.wandb_sink import WandbSink

__all__ = [
    "MetricsLogger",
    "read_metrics",
    "sink_scalars",
    "tensorboard_dir",
    "METRICS_FILE",
    "TENSORBOARD_DIR",
    "DEFAULT_CONSOLE_KEYS",
]

METRICS_FILE = "metrics.jsonl"
SUPERSEDED_FILE = "metrics.superseded.jsonl"
TENSORBOARD_DIR = "tensorboard"
RESERVED_KEYS = ("rollout_id", "global_step", "stage", "time")

DEFAULT_CONSOLE_KEYS: tuple[str, ...] = (
    "rollout/raw_reward",
    "rollout/response_len/mean",
    "train/loss",
    "train/pg_loss",
    "train/sft_loss",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/kl_loss",
    "train/entropy_loss",
    "train/grad_norm",
    "perf/rollout_time",
    "perf/train_time",
    "perf/tokens_per_s",
)


def tensorboard_dir(args: Namespace) -> Path:
    """Where ``--use-tensorboard`` writes: $TENSORBOARD_DIR, else with ``--tb-project-name``
    ``tensorboard_log/<project>/<experiment>`` (slime's rules), else ``<run-dir>/tensorboard``."""
    env = os.environ.get("TENSORBOARD_DIR")
    if env:
        return Path(env)
    if args.tb_project_name is not None:
        return Path("tensorboard_log") / args.tb_project_name / str(args.tb_experiment_name)
    return Path(args.run_dir) / TENSORBOARD_DIR


def sink_scalars(record: Mapping[str, Any]) -> dict[str, int | float]:
    """The metrics of a JSON record that TensorBoard and wandb receive: every int/float value
    (None, i.e. non-finite, and strings left out), the bookkeeping keys excluded."""
    return {
        k: v
        for k, v in record.items()
        if k not in RESERVED_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _metrics_path(path: str | Path) -> Path:
    p = Path(path)
    return p / METRICS_FILE if p.is_dir() else p


def _to_scalar(key: str, value: Any) -> Any:
    """Plain Python value for JSON: numbers -> int/float, 1-element tensors/arrays -> float, str kept."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"metric {key!r}: expected a scalar, got {type(value).__name__} ({e})") from None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str) or value is None:
        return value
    raise ValueError(f"metric {key!r}: unsupported value type {type(value).__name__}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def parse_metrics_lines(text: str) -> Iterator[tuple[int, dict[str, Any] | None, str | None, bool]]:
    """(line number, record or None, what is wrong or None, whether it is a torn last line) for
    every non-blank line of a metrics.jsonl's text. A torn last line is one without its newline
    that does not parse (a crash mid-write)."""
    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield lineno, None, f"not valid JSON ({e.msg})", lineno == len(lines) and not text.endswith("\n")
            continue
        if not isinstance(obj, dict):
            yield lineno, None, f"expected a JSON object, got {type(obj).__name__}", False
            continue
        yield lineno, obj, None, False


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` (or of ``<run_dir>/metrics.jsonl``), in file order.

    Blank lines are skipped; a truncated last line (a crash mid-write) is ignored; any other
    malformed line raises ``ValueError`` naming file and line.
    """
    p = _metrics_path(path)
    records: list[dict[str, Any]] = []
    for lineno, obj, problem, torn in parse_metrics_lines(p.read_text(encoding="utf-8")):
        if torn:
            break
        if problem:
            raise ValueError(f"{p}:{lineno}: {problem}")
        records.append(obj)
    return records


def _auto_step_offset(path: Path, stage: str | None) -> int:
    """Offset that makes this logger's global steps continue the file's.

    Same stage as the file's last record (a resumed stage, also without a stage name): keep that
    record's offset.
    New stage: start right after the largest global step so far. No file / no records: 0.
    """
    if not path.exists():
        return 0
    try:
        records = read_metrics(path)
    except ValueError:
        return 0
    steps = [r for r in records if isinstance(r.get("global_step"), int)]
    if not steps:
        return 0
    last = steps[-1]
    if last.get("stage") == stage and isinstance(last.get("rollout_id"), int):
        return last["global_step"] - last["rollout_id"]
    return max(r["global_step"] for r in steps) + 1


class MetricsLogger:
    """Append-only metrics sink for one stage of a run.

    ``run_dir``: directory holding ``metrics.jsonl`` (created if missing) and ``tensorboard/``.
    ``stage``: label written on each record (``log(..., stage=...)`` overrides it per call).
    ``step_offset``: added to ``step`` to form the global step (JSON ``global_step`` and the
    TensorBoard step); ``None`` derives it from the existing file (see ``_auto_step_offset``).
    ``console``: print one line per ``log`` with ``console_keys`` (plus every ``eval/*`` key),
    4 significant digits; non-finite values are always shown and flagged.
    ``tensorboard_dir``: where TensorBoard events go (default ``<run_dir>/tensorboard``).
    ``wandb``: a started wandb sink; the logger logs to it and finishes it on ``close``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        use_tensorboard: bool = False,
        stage: str | None = None,
        *,
        step_offset: int | None = None,
        console: bool = True,
        console_keys: Iterable[str] | None = None,
        tensorboard_dir: str | Path | None = None,
        wandb: WandbSink | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.stage = stage
        self.step_offset = _auto_step_offset(self.path, stage) if step_offset is None else int(step_offset)
        self.console = console
        self.console_keys = tuple(DEFAULT_CONSOLE_KEYS if console_keys is None else console_keys)
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")
        self._superseded_checked = False
        self._writer = None
        self._wandb = wandb
        if use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow import

            tb_dir = self.run_dir / TENSORBOARD_DIR if tensorboard_dir is None else Path(tensorboard_dir)
            self._writer = SummaryWriter(log_dir=str(tb_dir))

    @classmethod
    def from_args(cls, args: Namespace, *, console: bool = True) -> MetricsLogger:
        """The logger of one training stage: ``args.run_dir``, ``args.stage``, TensorBoard with
        ``--use-tensorboard`` (in ``tensorboard_dir(args)``), a wandb run with ``--use-wandb``.
        Prints the wandb run's mode and place."""
        from slime.observability.wandb_sink import WandbSink

        sink = WandbSink.from_args(args, args.run_dir)
        try:
            return cls(
                args.run_dir,
                use_tensorboard=args.use_tensorboard,
                stage=args.stage,
                console=console,
                tensorboard_dir=tensorboard_dir(args) if args.use_tensorboard else None,
                wandb=sink,
            )
        except BaseException:
            if sink is not None:
                sink.close()
            raise

    def log(self, step: int, metrics: Mapping[str, Any], *, stage: str | None = None) -> dict[str, Any]:
        """Append one record for ``step`` (slime's ``rollout_id``); returns the record as written."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise ValueError(f"step must be an integer, got {step!r}")
        step = int(step)
        stage = self.stage if stage is None else stage
        global_step = step + self.step_offset
        record: dict[str, Any] = {"rollout_id": step, "global_step": global_step}
        if stage is not None:
            record["stage"] = stage
        record["time"] = round(time.monotonic() - self._t0, 6)

        nonfinite: list[str] = []
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise ValueError(f"metric keys must be strings, got {key!r}")
            value = _to_scalar(key, value)
            if key in RESERVED_KEYS:
                if key == "rollout_id" and value == step:
                    continue
                raise ValueError(f"metric key {key!r} is reserved by MetricsLogger")
            if isinstance(value, float) and not math.isfinite(value):
                nonfinite.append(f"{key}={value}")
                value = None
            record[key] = value

        line = json.dumps(record, allow_nan=False, ensure_ascii=False)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"MetricsLogger for {self.path} is closed")
            if not self._superseded_checked:
                self._superseded_checked = True
                self._supersede_from(step, stage)
            self._file.write(line + "\n")
            self._file.flush()
            scalars = sink_scalars(record)  # one set of scalars, one step, for every sink below
            if self._writer is not None:
                for key, value in scalars.items():
                    self._writer.add_scalar(key, value, global_step)
                self._writer.flush()
            if self._wandb is not None:
                self._wandb.log(global_step, scalars)
        if self.console:
            print(self.summary_line(record, nonfinite), flush=True)
        return record

    def _supersede_from(self, step: int, stage: str | None) -> None:
        """A resumed stage starts again at `step`: rows of this stage from `step` on were written past
        the checkpoint it resumed from. Move them to SUPERSEDED_FILE (kept, not deleted)."""
        self._file.flush()
        try:
            records = read_metrics(self.path)
        except (ValueError, OSError):
            return  # a file this logger cannot read is left as it is
        late = [
            r
            for r in records
            if r.get("stage") == stage and isinstance(r.get("rollout_id"), int) and r["rollout_id"] >= step
        ]
        if not late:
            return
        late_ids = {id(r) for r in late}
        keep = [r for r in records if id(r) not in late_ids]
        with open(self.path.with_name(SUPERSEDED_FILE), "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in late)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep), encoding="utf-8")
        self._file.close()
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")

    def summary_line(self, record: Mapping[str, Any], nonfinite: list[str] | None = None) -> str:
        """``[stage] step 3 (global 13) | rollout/raw_reward=0.5 train/pg_loss=-0.01234 ...``."""
        head = f"[{record['stage']}] " if record.get("stage") is not None else ""
        head += f"step {record['rollout_id']}"
        if record.get("global_step") != record["rollout_id"]:
            head += f" (global {record['global_step']})"
        parts = []
        for key, value in record.items():
            if key in RESERVED_KEYS or value is None:
                continue
            if key in self.console_keys or key.startswith("eval/"):
                parts.append(f"{key}={_fmt(value)}")
        line = head + (" | " + " ".join(parts) if parts else "")
        if nonfinite:
            line += " | NON-FINITE: " + " ".join(nonfinite)
        return line

    def close(self) -> None:
        """Flush and close the JSONL file, the TensorBoard writer and the wandb run (idempotent)."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self._wandb is not None:
                self._wandb.close()
                self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
