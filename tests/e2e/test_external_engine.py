"""External engines (`--rollout-external-engine-addrs`): an engine server the test starts itself
(`slime serve`), used by a real run for rollout and updated from disk (delta transport: the
engine patches its local checkpoint and reloads it); an address nobody answers stops start-up
naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from slime.errors import SlimeError
from slime.utils.net import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400), pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture(scope="module")
def external_engine(tiny_model_dir, tmp_path_factory):
    from slime.engine.client import EngineClient

    root = tmp_path_factory.mktemp("external")
    port = free_port("127.0.0.1")
    log = open(root / "engine.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slime",
            "serve",
            "--model-path",
            str(tiny_model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num-threads",
            "1",
            "--weight-load-dirs",
            str(root),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while not EngineClient(url).health(timeout=1.0):
            assert proc.poll() is None and time.time() < deadline, (root / "engine.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, root
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_run_uses_and_updates_an_external_engine(external_engine, tiny_model_dir, task_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.engine.client import EngineClient
    from slime.train import train

    url, root = external_engine
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
            "--rm-type",
            "math",
            "--custom-rm-path",
            "tests.e2e.hooks.digit_reward",
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "8",
            "--global-batch-size",
            "8",
            "--micro-batch-size",
            "8",
            "--lr",
            "1e-3",
            "--run-dir",
            str(run_dir),
            "--rollout-external-engine-addrs",
            url.removeprefix("http://"),
            "--update-weight-mode",
            "delta",
            "--update-weight-transport",
            "disk",
            "--update-weight-disk-dir",
            str(root / "pub"),
            "--update-weight-local-checkpoint-dir",
            str(root / "local"),
            "--check-weight-update-equal",
            "--save",
            str(tmp_path / "ckpt"),
            "--save-interval",
            "2",
        ]
    )
    train(args)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    synced = [r for r in rows if "perf/weight_sync_bytes" in r]
    assert len(synced) == 2
    for r in synced:
        assert r["perf/weight_sync_delta_refused"] == 0
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-4
        assert r["rollout/num_samples"] == 8  # the external engine generated the rollout
    assert EngineClient(url).get_weight_version() == "2"
    # the engine's local checkpoint is the trainer's final weights, bit for bit
    saved = {}
    for f in (tmp_path / "ckpt").rglob("*.safetensors"):
        saved.update(load_file(str(f)))
    local = load_file(str(root / "local" / "model.safetensors"))
    common = [n for n in local if n in saved]
    assert common
    for n in common:
        assert torch.equal(local[n], saved[n].to(local[n].dtype)), n


def test_unreachable_external_engine_stops_start_up(tiny_model_dir, task_dir, tmp_path):
    from slime.arguments import parse_args
    from slime.train import train

    addr = f"127.0.0.1:{free_port('127.0.0.1')}"
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
            "--rm-type",
            "math",
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "4",
            "--run-dir",
            str(tmp_path / "run"),
            "--rollout-external-engine-addrs",
            addr,
        ]
    )
    with pytest.raises(SlimeError, match=f"the engine at http://{addr} does not answer"):
        train(args)  # preflight: before the placement or the trainer start
