"""Shared fixtures and the suite's tiers.

Fixtures: one tiny model and one task data set per test session (built offline); the built-in
engine server the engine, rollout, sync and ray tests talk to, and the tiny model loaded directly
with transformers for reference values; one local Ray cluster per session for the runs that
call `slime.train` in this process (`ray_cluster`).

Tiers (markers declared in pyproject.toml):
- `e2e`: the test starts Ray, an engine server process or a real training run. Everything under
  tests/e2e/ and every test that uses a fixture in E2E_FIXTURES is marked here; a test elsewhere
  that starts one itself is marked by hand. `pytest -m "not e2e"` is the fast tier.
- `slow`: minutes-long runs (the default job, crash and resume, ...): `-m "not slow"` skips them.
- `soak`: long repetitions of an e2e test (ten kills of a run instead of three); deselected unless
  `--soak` is given or the -m expression names `soak`.
"""

import os

# The test process computes references while an engine server (its own process) runs beside it:
# one thread each, never oversubscribed cores (set before torch is imported)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib
import warnings

import pytest
import torch

torch.set_num_threads(1)


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


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    """The same checkpoint loaded directly with transformers (fp32), for reference values."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """A built-in engine server (a real process) for the module's tests."""
    from tests.engine.engine_test_utils import start_engine

    eng = start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp("engine_log"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def client(engine):
    from slime.engine.client import EngineClient

    with EngineClient(engine.url, timeout=60) as c:
        yield c


# ------------------------------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def ray_cluster(request):
    """The session's local Ray cluster for the runs of `slime.train` in this process: started by
    slime's own `init_ray` (the runtime environment, loopback binding and token auth of a run;
    logical CPUs for the largest run this machine takes, one trainer rank and one engine apart)
    when a module first needs it, and kept for the next (starting one costs ~6 s). A run that finds
    Ray initialized uses it and releases only what it created (its actors, engines, router and
    placement group); `slime.train.shutdown` leaves the cluster up, as it was not the run's. A
    module whose runs left a placement group or a busy CPU behind (a run that failed mid-way) stops
    the cluster, so the next module starts on a clean one; the session's end stops it."""
    import ray

    if not ray.is_initialized():
        from slime.ray.placement_group import init_ray
        from tests.helpers import make_args

        with contextlib.chdir(request.config.rootpath):  # the workers import hooks from the repo root
            init_ray(make_args())
    yield
    if ray.is_initialized() and _left_behind():
        ray.shutdown()


def _left_behind() -> bool:
    """Whether the shared cluster still holds a placement group or a CPU, a few seconds after the
    module's last run (Ray frees what a run released asynchronously)."""
    import time

    import ray
    from ray.util import placement_group_table

    deadline = time.monotonic() + 10
    while True:
        groups = [g for g in placement_group_table().values() if g["state"] != "REMOVED"]
        busy = ray.available_resources().get("CPU", 0) != ray.cluster_resources().get("CPU", 0)
        if not (groups or busy) or time.monotonic() > deadline:
            return bool(groups or busy)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def without_shared_ray():
    """For a module whose tests start a Ray cluster of their own, or need none initialized in this
    process (a module does not use both this and `ray_cluster`): the shared cluster, if up, stops
    first; the next module that asks for it starts it again."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------------------------- tiers
# Fixtures that start an engine server process or Ray: a test that uses one (even through another
# fixture) is an e2e test
E2E_FIXTURES = {"engine", "ray_cluster"}
E2E_DIR = os.path.join(os.path.dirname(__file__), "e2e")


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", help="also run the soak tests (marker `soak`)")


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    soak = config.getoption("--soak") or "soak" in (config.getoption("markexpr") or "")
    keep, soaks = [], []
    for item in items:
        if str(item.path).startswith(E2E_DIR + os.sep) or E2E_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.e2e)
        (keep if soak or not item.get_closest_marker("soak") else soaks).append(item)
    if soaks:
        config.hook.pytest_deselected(items=soaks)
        items[:] = keep


def pytest_unconfigure(config):
    """A session stopped early (-x, Ctrl-C) leaves no cluster behind."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
