"""slime's idle rollout function sleeps an hour at a time, logging each hour, and never returns."""

from __future__ import annotations

import logging

import pytest

from slime.rollout import sleep_rollout


def test_sleep_rollout_sleeps_an_hour_at_a_time_and_never_returns(monkeypatch, caplog):
    slept: list[float] = []

    def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise KeyboardInterrupt  # the only way out, as for slime's

    monkeypatch.setattr(sleep_rollout.time, "sleep", fake_sleep)
    with caplog.at_level(logging.INFO, logger=sleep_rollout.__name__), pytest.raises(KeyboardInterrupt):
        sleep_rollout.sleep(None, 0, None, evaluation=False)
    assert slept == [3600, 3600, 3600]
    assert [r.getMessage() for r in caplog.records] == ["rollout sleep for 1 hours", "rollout sleep for 2 hours"]
