"""Console progress: one bar per stage, showing the phase of the current step.

Phases (rollout, train, sync, eval, save) appear in the bar's description, so a slow
phase is visible while it runs; a short metrics summary follows each step.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

SHOWN = (
    ("rollout/raw_reward", "reward"),
    ("train/pg_loss", "pg_loss"),
    ("train/loss", "loss"),
    ("perf/rollout_time", "t_roll"),
    ("perf/train_time", "t_train"),
)


class StageProgress:
    def __init__(self, stage: str, total: int, initial: int = 0) -> None:
        self.stage = stage
        self.bar = tqdm(
            total=total, initial=initial, desc=stage, unit="step", file=sys.stdout, dynamic_ncols=True, mininterval=0.5
        )
        self.evals: dict[str, float] = {}

    def phase(self, name: str) -> None:
        self.bar.set_description(f"{self.stage} [{name:>7}]", refresh=False)

    def _postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        self.evals.update({k: v for k, v in metrics.items() if k.startswith("eval/") and k.count("/") == 1})
        post = {short: f"{metrics[key]:.3g}" for key, short in SHOWN if isinstance(metrics.get(key), (int, float))}
        post.update({k: f"{v:.3f}" for k, v in self.evals.items()})
        return post

    def note(self, metrics: dict[str, Any]) -> None:
        self.bar.set_postfix(self._postfix(metrics), refresh=True)
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/") and k.count("/") == 1}
        if evals:
            self.bar.write(f"[{self.stage}] step {self.bar.n}: " + ", ".join(f"{k}={v:.3f}" for k, v in evals.items()))

    def step(self, metrics: dict[str, Any]) -> None:
        self.bar.update(1)
        self.note(metrics)

    def close(self) -> None:
        self.bar.close()
