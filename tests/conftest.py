"""Shared fixtures: one tiny model and one task data set per test session (built offline)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from slime.data.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory):
    from slime.data.arithmetic import write_arithmetic_dataset

    out = tmp_path_factory.mktemp("task")
    write_arithmetic_dataset(out, difficulty=2, num_eval=32, seed=0)
    return out
