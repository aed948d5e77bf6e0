"""slime.rollout.fully_async_rollout (examples/fully_async): staleness bookkeeping, the worker against a real engine, one real run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from slime.errors import SlimeError  # noqa: E402
from slime.rollout import fully_async_rollout as fa  # noqa: E402
from slime.utils.types import Sample  # noqa: E402
from tests.helpers import make_args  # noqa: E402

P = fa.METRIC_PREFIX


# ------------------------------------------------------------------------------------ pure logic
def test_weight_version_prefers_the_samples_own_and_takes_the_oldest():
    assert fa.parse_version("3") == 3 and fa.parse_version("default") is None and fa.parse_version(None) is None
    group = [Sample(weight_versions=["4"]), Sample(weight_versions=["2", "5"])]
    assert fa.group_weight_version(group, probed=1) == 2
    assert fa.group_weight_version([Sample(), Sample(weight_versions=["default"])], probed=1) == 1
    assert fa.group_weight_version([Sample()], probed=None) is None


def test_staleness_metrics():
    m = fa.staleness_metrics(5, [5, 3, None, 4])
    assert m[f"{P}/staleness_mean"] == 1.0 and m[f"{P}/staleness_max"] == 2 and m[f"{P}/staleness_min"] == 0
    assert m[f"{P}/unknown_version_groups"] == 1
    assert fa.staleness_metrics(0, [None]) == {f"{P}/unknown_version_groups": 1.0}


def test_queue_limits_from_the_environment(monkeypatch):
    args = make_args(rollout_batch_size=4)
    monkeypatch.delenv(fa.QUEUE_SIZE_ENV, raising=False)
    monkeypatch.delenv(fa.MAX_INFLIGHT_ENV, raising=False)
    assert fa.queue_limits(args) == (8, 4)
    monkeypatch.setenv(fa.QUEUE_SIZE_ENV, "3")
    assert fa.queue_limits(args) == (3, 3)  # in-flight groups count against the queue size
    monkeypatch.setenv(fa.MAX_INFLIGHT_ENV, "1")
    assert fa.queue_limits(args) == (3, 1)
    monkeypatch.setenv(fa.QUEUE_SIZE_ENV, "zero")
    with pytest.raises(SlimeError, match=fa.QUEUE_SIZE_ENV):
        fa.queue_limits(args)


# ------------------------------------------------------------------------------------ real engine
# (the `engine` fixture, a real engine server, is in tests/examples/conftest.py)


@pytest.fixture
def rollout_args(tiny_model_dir, task_dir, engine, monkeypatch):
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    monkeypatch.setenv(fa.QUEUE_SIZE_ENV, "3")
    monkeypatch.delenv(fa.MAX_INFLIGHT_ENV, raising=False)
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    GenerateState.reset()
    yield parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rm-type",
            "math",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "6",
            "--global-batch-size",
            "4",
            "--num-rollout",
            "3",
            "--rollout-function-path",
            "examples.fully_async.rollout.generate_rollout",
            "--sglang-router-ip",
            host,
            "--sglang-router-port",
            port,
        ]
    )
    fa.reset_worker()
    GenerateState.reset()


def _set_version(engine, version: str) -> None:
    from slime.utils.async_utils import run
    from slime.utils.http_utils import post

    assert run(post(engine.url + "/update_weight_version", {"new_version": version}))["success"]


def _wait_for(cond, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_worker_fills_a_bounded_queue_and_records_staleness(rollout_args, engine):
    from slime.data.data_source import RolloutDataSource

    args, ds = rollout_args, RolloutDataSource(rollout_args)
    _set_version(engine, "0")
    out = fa.generate_rollout(args, 0, ds)
    worker = fa._worker
    assert worker is not None and worker.thread.daemon and worker.thread.is_alive()
    assert len(out.samples) == 2 and all(len(g) == 2 for g in out.samples)
    assert out.metrics[f"{P}/groups_from_queue"] == 2 and out.metrics[f"{P}/staleness_mean"] == 0
    for g in out.samples:
        assert all(s.status != Sample.Status.FAILED and s.metadata["fully_async"]["weight_version"] == 0 for s in g)

    # Between rollouts the worker refills the queue, then back-pressure stops it: 2 taken + 3 queued.
    _wait_for(lambda: worker.queue.qsize() == 3)
    time.sleep(0.3)
    assert worker.groups_generated == 5 and ds.group_counter == 5 and worker.inflight == 0

    _set_version(engine, "1")  # what the trainer's weight sync does after rollout 0
    out = fa.generate_rollout(args, 1, ds)
    m = out.metrics
    assert m[f"{P}/queue_size_at_request"] == 3 and m[f"{P}/queue_capacity"] == 3
    assert m[f"{P}/staleness_mean"] == 1 and m[f"{P}/staleness_min"] == 1  # generated before the update
    assert m[f"{P}/wait_time"] < 1.0  # taken from the queue, not generated on demand

    # Groups generated after the update carry the new version.
    _wait_for(lambda: worker.queue.qsize() == 3)
    versions = [f.weight_version for f in list(worker.queue.queue)]
    assert versions[0] == 0 and versions[-1] == 1

    out = fa.generate_rollout(args, 2, ds)  # the last rollout stops the worker
    assert out.metrics[f"{P}/staleness_max"] >= 1
    worker.thread.join(10)
    assert not worker.thread.is_alive() and worker.error is None


class _Breakable:
    """A data source that raises once `broken` is set, as a bug in the worker's own path would."""

    def __init__(self, ds, broken: bool = False):
        self.ds, self.broken = ds, broken

    def get_samples(self, n: int):
        if self.broken:
            raise RuntimeError("data source broke")
        return self.ds.get_samples(n)


def test_worker_errors_surface_in_the_next_rollout(rollout_args):
    from slime.data.data_source import RolloutDataSource

    args = rollout_args
    ds = _Breakable(RolloutDataSource(args))
    assert len(fa.generate_rollout(args, 0, ds).samples) == 2
    worker = fa._worker
    _wait_for(lambda: worker.queue.qsize() == 3)  # full: the worker waits, fetching nothing
    ds.broken = True
    worker.queue.get()  # room again: the worker fetches a prompt and fails
    worker.thread.join(10)
    assert not worker.thread.is_alive() and isinstance(worker.error, RuntimeError)
    with pytest.raises(SlimeError, match="background rollout worker failed: RuntimeError: data source broke"):
        fa.generate_rollout(args, 1, ds)


def test_a_blocked_rollout_is_woken_by_a_worker_error(rollout_args):
    from slime.data.data_source import RolloutDataSource

    args = rollout_args
    ds = _Breakable(RolloutDataSource(args), broken=True)
    t0 = time.monotonic()
    with pytest.raises(SlimeError, match="data source broke"):
        fa.generate_rollout(args, 0, ds)
    assert time.monotonic() - t0 < 5


def test_evaluation_is_the_default_synchronous_rollout(rollout_args, task_dir):
    args = rollout_args
    args.eval_prompt_data = ["arith", str(task_dir / "eval.jsonl")]
    results = fa.generate_rollout(args, 0, None, evaluation=True)
    assert len(results["arith"]["samples"]) == 32
    assert fa._worker is None  # evaluation does not start the worker


# ------------------------------------------------------------------------------------ real run
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_short_training_run(without_shared_ray, tiny_model_dir, task_dir, tmp_path, monkeypatch):
    """Separate engine and trainer processes (no --colocate): generation overlaps training. The
    queue size reaches the RolloutManager through its Ray worker's environment, inherited from the
    cluster's start: this run starts (and stops) a cluster of its own."""
    from slime.arguments import parse_args
    from slime.train import shutdown, train

    monkeypatch.setenv(fa.QUEUE_SIZE_ENV, "8")  # reaches the RolloutManager through Ray's worker env
    run_dir = tmp_path / "run"
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(task_dir / "train.jsonl"),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rollout-shuffle",
            "--rm-type",
            "math",
            "--rollout-function-path",
            "examples.fully_async.rollout.generate_rollout",
            "--num-rollout",
            "3",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "8",
            "--global-batch-size",
            "16",
            "--micro-batch-size",
            "16",
            "--lr",
            "1e-3",
            "--run-dir",
            str(run_dir),
            # one core each: the engine keeps generating while the trainer trains
            "--train-num-threads",
            "1",
            "--sglang-num-threads",
            "1",
        ]
    )
    try:
        train(args)
    finally:
        shutdown()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2, 3]  # one row per rollout
    for r in rows:
        assert math.isfinite(r["rollout/raw_reward"]) and math.isfinite(r["train/pg_loss"])
        assert r["rollout/num_samples"] == 16 and r["rollout/status/failed"] == 0
        assert r[f"{P}/groups_from_queue"] == 4 and r[f"{P}/queue_capacity"] == 8
        assert r[f"{P}/unknown_version_groups"] == 0 and r[f"{P}/staleness_min"] >= 0
    # The worker ran ahead while the trainer trained: later rollouts found groups already queued,
    # generated by older weights.
    assert all(r[f"{P}/queue_size_at_request"] > 0 for r in rows[1:])
    assert max(r[f"{P}/staleness_max"] for r in rows) >= 1
