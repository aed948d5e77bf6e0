"""slime.rollout.fully_async_rollout around weight updates, against a real engine server: groups
over --max-weight-staleness are dropped and counted; with --partial-rollout a weight update aborts
the in-flight groups, which go back to the Data Buffer and are finished by the new weights."""

from __future__ import annotations

import time

import pytest

from slime.rollout import fully_async_rollout as fa
from slime.utils.types import Sample

P = fa.METRIC_PREFIX


def test_too_stale():
    assert not fa.too_stale(5, 3, None)  # no bound
    assert not fa.too_stale(5, 3, 2) and fa.too_stale(5, 2, 2)  # 5 - 2 = 3 updates old > 2
    assert not fa.too_stale(5, None, 0)  # unknown version: kept
    assert fa.too_stale(1, 0, 0) and not fa.too_stale(1, 1, 0)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--max-weight-staleness", "-1"], "--max-weight-staleness must be >= 0"),
        (
            ["--max-weight-staleness", "1", "--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout"],
            "--max-weight-staleness applies to the fully async rollout",
        ),
    ],
)
def test_bad_staleness_bound_stops_at_parsing(extra, needle):
    from slime.arguments import parse_args
    from slime.errors import SlimeError

    base = [
        "--hf-checkpoint",
        "x",
        "--prompt-data",
        "y",
        "--rollout-batch-size",
        "2",
        "--num-rollout",
        "1",
        "--rollout-function-path",
        "slime.rollout.fully_async_rollout.generate_rollout",
    ]
    with pytest.raises(SlimeError, match=needle):
        parse_args(base + extra)


def _args(tiny_model_dir, task_dir, engine, *extra: str):
    from slime.arguments import parse_args

    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    return parse_args(
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
            "--global-batch-size",
            "4",
            "--num-rollout",
            "100",
            "--rollout-function-path",
            "slime.rollout.fully_async_rollout.generate_rollout",
            "--sglang-router-ip",
            host,
            "--sglang-router-port",
            port,
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """This module's engine: 8 ms a decode step, so a group of 160-token responses is in flight for over
    a second (an abort must land mid-generation even when the test process is descheduled under load)."""
    from slime.ray.engine_process import EngineProcess

    extra = ["--random-seed", "0", "--weight-version", "0", "--step-delay-ms", "8"]
    eng = EngineProcess.start(tiny_model_dir, num_threads=1, extra_args=extra)
    try:
        eng.wait_until_healthy(timeout=120)
        yield eng
    finally:
        eng.stop()


@pytest.fixture
def fresh(engine, monkeypatch):
    from slime.rollout.sglang_rollout import GenerateState

    monkeypatch.setenv(fa.QUEUE_SIZE_ENV, "3")
    monkeypatch.delenv(fa.MAX_INFLIGHT_ENV, raising=False)
    fa.reset_worker()
    GenerateState.reset()
    yield
    fa.reset_worker()
    GenerateState.reset()
    _set_version(engine, "0")


def _set_version(engine, version: str) -> None:
    from slime.utils.async_utils import run
    from slime.utils.http_utils import post

    assert run(post(engine.url + "/update_weight_version", {"new_version": version}))["success"]


def _engine_requests(engine) -> int:
    from slime.utils.async_utils import run
    from slime.utils.http_utils import get

    return run(get(engine.url + "/get_load"))["num_reqs"]


def _wait_for(cond, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_groups_over_the_staleness_bound_are_dropped_and_counted(tiny_model_dir, task_dir, engine, fresh):
    from slime.data.data_source import RolloutDataSourceWithBuffer

    args = _args(tiny_model_dir, task_dir, engine, "--rollout-max-response-len", "6", "--max-weight-staleness", "2")
    ds = RolloutDataSourceWithBuffer(args)
    _set_version(engine, "0")
    out = fa.generate_rollout(args, 0, ds)
    assert out.metrics[f"{P}/dropped_stale_groups"] == 0
    worker = fa._worker
    _wait_for(lambda: worker.queue.qsize() == 3)  # three more groups by version 0
    time.sleep(0.2)
    _set_version(engine, "5")  # the trainer is now 5 updates ahead of them
    out = fa.generate_rollout(args, 5, ds)
    m = out.metrics
    # reference: all 3 queued groups are 5 - 0 = 5 > 2 updates old; the 2 taken are new, by version 5
    assert m[f"{P}/dropped_stale_groups"] == 3 and m[f"{P}/dropped_stale_groups_total"] == 3
    assert len(out.samples) == 2
    assert all(s.weight_versions == ["5"] for g in out.samples for s in g)
    assert m[f"{P}/staleness_max"] == 0


def test_a_weight_update_aborts_in_flight_groups_and_the_new_weights_finish_them(
    tiny_model_dir, task_dir, engine, fresh
):
    from slime.data.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import GenerateState

    args = _args(
        tiny_model_dir,
        task_dir,
        engine,
        "--rollout-max-response-len",
        "160",
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
    )
    ds = RolloutDataSourceWithBuffer(args)
    GenerateState(args).sampling_params["ignore_eos"] = True  # long responses: the abort lands mid-way
    _set_version(engine, "0")
    fa.generate_rollout(args, 0, ds)
    worker = fa._worker
    # the next groups are generating on the engine (160 decode steps of >= 8 ms each): abort now
    _wait_for(lambda: worker.inflight > 0 and _engine_requests(engine) > 0, timeout=10)
    time.sleep(0.03)

    # what the rollout manager does around a sync (RolloutManager.before/after_weight_update)
    metrics = fa.generate_rollout.before_weight_update(args)
    resumed = metrics[f"{P}/groups_resumed_at_update"]
    assert resumed >= 1 and worker.inflight == 0 and len(ds.buffer) == resumed
    partial = [s for g in ds.buffer for s in g]
    assert all(s.weight_versions in ([], ["0"]) for s in partial)
    assert any(s.status == Sample.Status.ABORTED and 0 < s.response_length < 160 for s in partial)
    _set_version(engine, "1")
    fa.generate_rollout.after_weight_update(args)

    groups = fa.generate_rollout(args, 1, ds).samples + fa.generate_rollout(args, 2, ds).samples
    finished = [s for g in groups for s in g]
    assert all(s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) for s in finished)
    resumed_samples = [s for s in finished if s.weight_versions == ["0", "1"]]
    assert resumed_samples, [s.weight_versions for s in finished]
    for s in resumed_samples:
        assert s.response_length == 160  # finished by the new weights, one response
        old = s.loss_mask.index(1) if 1 in s.loss_mask else len(s.loss_mask)
        # the tokens of the old weights are masked, the new weights' are trained on
        assert 0 < old < 160 and s.loss_mask == [0] * old + [1] * (160 - old)
