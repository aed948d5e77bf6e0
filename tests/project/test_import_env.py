"""Importing slime changes nothing process-wide: the environment a process runs with is set where
it starts (the CLI, the engine server, the environment its children are started with)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = sorted(
    p.name for p in (ROOT / "slime").iterdir() if p.is_dir() and (p / "__init__.py").exists()
) + sorted(p.stem for p in (ROOT / "slime").glob("*.py") if p.stem not in ("__init__", "__main__"))

# Libraries that set variables of their own when imported (Ray: RAY_CLIENT_MODE; torch's compiler:
# TORCHINDUCTOR_CACHE_DIR) are imported first: what is checked is what slime's own code sets.
_PROBE = """
import importlib, json, os, sys
import ray, torch._dynamo
changes = {}
for name in sys.argv[1:]:
    before = dict(os.environ)
    importlib.import_module(name)
    after = dict(os.environ)
    diff = {k: [before.get(k), after.get(k)] for k in set(before) | set(after) if before.get(k) != after.get(k)}
    if diff:
        changes[name] = diff
print(json.dumps(changes))
"""


def test_importing_slime_and_each_top_level_module_leaves_the_environment_alone():
    """`slime` first, then each subpackage and top-level module (one process: torch and Ray load once)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_", "TOKENIZERS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    modules = ["slime", *(f"slime.{name}" for name in SUBPACKAGES)]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_the_cli_and_engine_children_get_the_hub_settings(monkeypatch):
    from slime.ray.engine_process import child_env
    from slime.utils.misc import HUB_ENV, set_hub_env

    for key in HUB_ENV:
        monkeypatch.delenv(key, raising=False)
    assert all(child_env()[k] == v for k, v in HUB_ENV.items())
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user's value wins
    assert child_env()["HF_HUB_OFFLINE"] == "0"
    set_hub_env()
    assert os.environ["HF_HUB_OFFLINE"] == "0" and os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_no_benchmark_or_example_turns_ray_token_auth_off():
    """Benchmarks and examples run the way a user's run does: with Ray's token authentication on.
    (A benchmark module that set RAY_AUTH_MODE=disabled on import also switched it off for the test
    session that imported it.)"""
    import re

    pattern = re.compile(r"RAY_AUTH_MODE\W+disabled")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("bench", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
