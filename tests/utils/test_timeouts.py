"""Timeouts everywhere, so runs survive and explain themselves: bad settings stop at
parsing; a server that never answers costs a bounded time; retries back off; the trainer's weight
snapshot (what a restarted engine loads) is written atomically with its version."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch

from slime.errors import SlimeError
from tests.helpers import make_args


# ------------------------------------------------------------------------------------ parsing
def test_a_health_check_timeout_longer_than_the_interval_is_slimes_and_accepted():
    args = make_args("--rollout-health-check-timeout", "40", "--rollout-health-check-interval", "10")
    assert (args.rollout_health_check_timeout, args.rollout_health_check_interval) == (40, 10)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--rollout-health-check-interval", "0"], "--rollout-health-check-interval must be a positive"),
        (["--rollout-health-check-timeout", "-1"], "--rollout-health-check-timeout must be a positive"),
        (["--rollout-health-check-first-wait", "-5"], "--rollout-health-check-first-wait must be >= 0"),
        (["--sglang-router-request-timeout-secs", "0"], "--sglang-router-request-timeout-secs must be a positive"),
        (["--rollout-request-max-retries", "0"], "--rollout-request-max-retries must be >= 1"),
        (["--rollout-request-retry-interval", "nan"], "--rollout-request-retry-interval must be a positive"),
        (["--engine-control-timeout-secs", "0"], "--engine-control-timeout-secs must be a positive"),
        (["--distributed-timeout-minutes", "0"], "--distributed-timeout-minutes must be > 0"),
        (
            ["--use-fault-tolerance", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "3000"],
            "--use-fault-tolerance restarts the engines this run starts",
        ),
    ],
)
def test_settings_that_cannot_work_stop_at_parsing(argv, needle):
    with pytest.raises(SlimeError) as e:
        make_args(*argv)
    assert needle in str(e.value)


def test_slimes_defaults_and_meanings():
    args = make_args()
    assert (
        args.use_fault_tolerance,
        args.rollout_health_check_interval,
        args.rollout_health_check_timeout,
        args.rollout_health_check_first_wait,
    ) == (False, 30.0, 30.0, 0)
    assert args.sglang_router_request_timeout_secs == 14400
    assert args.distributed_timeout_minutes == 10  # Megatron's option, slime's default
    args = make_args(
        "--use-fault-tolerance", "--rollout-health-check-interval", "5", "--rollout-health-check-timeout", "5"
    )  # equal is fine (slime's defaults are equal)
    assert args.use_fault_tolerance and args.rollout_health_check_timeout == 5.0


def test_trainer_process_group_waits_distributed_timeout_minutes(monkeypatch):
    """The gloo group's timeout is --distributed-timeout-minutes (slime's 10), not gloo's 30."""
    import os
    from datetime import timedelta

    from slime.backends.torch import actor as actor_mod

    seen = {}

    class Stop(Exception):
        pass

    def init_process_group(backend, **kw):
        seen.update(kw, backend=backend)
        raise Stop

    monkeypatch.setattr(actor_mod.dist, "init_process_group", init_process_group)
    monkeypatch.setattr(actor_mod, "configure_torch_threads", lambda n: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the actor sets MASTER_ADDR/PORT
    rank = actor_mod.TrainActor(make_args("--distributed-timeout-minutes", "3"), 1, 2, "127.0.0.1", 1, 1)
    with pytest.raises(Stop):
        rank.init()
    assert seen["backend"] == "gloo" and seen["timeout"] == timedelta(minutes=3)


# ------------------------------------------------------------------------------ HTTP client
class _Silent:
    """A TCP server that accepts connections and never answers (a hung engine)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_server_that_never_answers_costs_attempts_times_the_timeout():
    from slime.utils import http_utils
    from slime.utils.http_utils import HTTPRequestError, post

    srv = _Silent()
    saved = dict(http_utils._limits)
    try:
        http_utils.configure(timeout=0.3, max_retries=3, retry_interval=0.1)

        async def go():
            try:
                await post(f"http://127.0.0.1:{srv.port}/generate", {"x": 1})
            finally:
                await http_utils.close_sessions()

        t0 = time.monotonic()
        with pytest.raises(HTTPRequestError) as e:
            asyncio.run(go())
        took = time.monotonic() - t0
        assert "failed after 3 attempts" in str(e.value)
        # 3 attempts of 0.3 s and two waits of <= 0.1 s; never the old "forever"
        assert 0.85 < took < 3.0, took
        assert len(srv.conns) == 3  # every attempt really went out
    finally:
        http_utils.configure(**saved)
        srv.close()


def test_retry_waits_back_off_up_to_the_interval():
    from slime.utils.http_utils import retry_delay

    assert [retry_delay(k, 1.0) for k in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert retry_delay(3, 0.25) == 0.25


def test_engine_client_control_calls_have_a_timeout():
    from slime.engine import client as engine_client
    from slime.utils.http_utils import HTTPRequestError

    srv = _Silent()
    saved = engine_client.DEFAULT_TIMEOUT_S
    try:
        engine_client.set_default_timeout(0.4)
        t0 = time.monotonic()
        with pytest.raises(HTTPRequestError) as e:
            engine_client.client_for(f"http://127.0.0.1:{srv.port}").flush_cache()
        assert time.monotonic() - t0 < 3.0 and "Timeout" in str(e.value)
    finally:
        engine_client.set_default_timeout(saved)
        srv.close()


# ---------------------------------------------------------------------------- weight snapshot
def test_weight_snapshot_is_atomic_and_carries_its_version(tmp_path):
    from slime.engine.model_runner import ModelRunner
    from slime.utils.checkpoint_layout import (
        latest_checkpoint_note,
        weight_snapshot_dir,
        weight_snapshot_version,
        write_weight_snapshot,
    )

    assert weight_snapshot_version(tmp_path) is None
    a = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    write_weight_snapshot(tmp_path, a, "4")
    b = {"w": torch.ones(2, 3)}
    write_weight_snapshot(tmp_path, b, "5")
    assert weight_snapshot_version(tmp_path) == "5"
    root = weight_snapshot_dir(tmp_path)
    assert [p.name for p in root.iterdir()] == ["model.safetensors"]  # no temporary file left behind
    loaded = ModelRunner.read_safetensors_dir(str(root))  # what /update_weights_from_disk reads
    assert torch.equal(loaded["w"], b["w"])

    save = tmp_path / "ckpt"
    assert "no complete checkpoint" in latest_checkpoint_note(str(save))
    (save / "iter_0000003").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    assert f"--load {save}" in latest_checkpoint_note(str(save)) and "iter_0000003" in latest_checkpoint_note(str(save))
