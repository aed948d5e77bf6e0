"""More than one machine: a 2-node Ray cluster started as a user starts one (`ray start --head`, then
`ray start --address` on the second node; token authentication on), joined with RAY_ADDRESS. A
disaggregated run places the trainer and the engine on different nodes (one CPU each), runs two
rollouts, and Ray's own actor table says on which node each ran.

Both nodes are this machine: Ray binds a multi-node cluster to the host's routable address (it
refuses loopback-only nodes for a second node), so the nodes talk over that address, with the token.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# clusters of their own (two nodes by `ray start`; a local one in this process): not the shared one
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("without_shared_ray"),
]

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT_S = 240  # `ray start` takes 20-90 s on a loaded 2-core machine
ENABLE_CLUSTERS = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # what slime's local cluster sets to 0 (loopback only)


def _free_port() -> int:
    from slime.utils.net import free_port

    return free_port()


# ------------------------------------------------------------------------------------ two nodes
class RayNode:
    """One `ray start --block` process (its own process group, so that it and its children stop together)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [RAY, "start", "--block", "--disable-usage-stats", *argv],
            env=env,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if "Ray runtime started" in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited ({self.proc.returncode}):\n{text[-2000:]}")
            time.sleep(1)
        raise RuntimeError(f"ray start did not start within {START_TIMEOUT_S} s:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        # `ray start --block` often outwaits a SIGTERM by far (30 s seen): a test cluster keeps nothing
        # worth a clean stop, so it gets 5 s before SIGKILL
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # the group's other processes (raylet, GCS, workers) may outlive the CLI a moment
            time.sleep(2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    """(address, env) of a head node and a second node, one logical CPU each, token auth on."""
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    base = tmp_path_factory.mktemp("cluster")
    token = base / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    # a local cluster started earlier in this process (init_ray) switched multi-node off for its children
    env.pop(ENABLE_CLUSTERS, None)
    port = _free_port()
    temp_dir = Path(f"/tmp/slime-mn-{os.getpid()}")  # short: Ray's socket paths must fit 107 bytes
    head = RayNode(
        [
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--num-cpus",
            "1",
            "--include-dashboard",
            "false",
            "--temp-dir",
            str(temp_dir),
        ],
        base / "head.log",
        env,
    )
    nodes = [head]
    try:
        head.wait_started()
        second = RayNode(["--address", f"127.0.0.1:{port}", "--num-cpus", "1"], base / "second.log", env)
        nodes.append(second)
        second.wait_started()
        yield f"127.0.0.1:{port}", env
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)  # the nodes' session logs


@pytest.fixture(scope="module")
def cluster_run(two_node_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    """A disaggregated slime run (1 trainer rank + 1 engine) on the 2-node cluster, in this process
    as the driver (RAY_ADDRESS), then Ray's actor table (kept for finished actors)."""
    import ray
    from ray._private import ray_constants, state

    from slime.arguments import parse_args
    from slime.train import train

    address, env = two_node_cluster
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", ENABLE_CLUSTERS)}
    os.environ.update(RAY_ADDRESS=address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=env["RAY_AUTH_TOKEN_PATH"])
    os.environ.pop(ENABLE_CLUSTERS, None)
    saved_flag, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, True
    run_dir = tmp_path_factory.mktemp("run")
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
            "--offload-train",
            "--check-weight-update-equal",
        ]
    )
    try:
        last = train(args)
        nodes = {n["NodeID"]: n for n in ray.nodes()}
        actors = list(state.actors().values())
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
    return args, run_dir, last, nodes, actors


def _node_of(actors: list[dict], class_name: str) -> list[str]:
    return [a["Address"]["NodeID"] for a in actors if a["ActorClassName"].endswith(class_name)]


def test_trainer_and_engine_ran_on_different_nodes(cluster_run):
    args, run_dir, last, nodes, actors = cluster_run
    assert len([n for n in nodes.values() if n["Alive"]]) == 2
    trainer, engine = _node_of(actors, "TrainActor"), _node_of(actors, "EngineActor")
    assert len(trainer) == 1 and len(engine) == 1, [a["ActorClassName"] for a in actors]
    assert trainer[0] != engine[0]
    assert {trainer[0], engine[0]} == set(nodes)


def test_the_run_trained_and_synced_across_nodes(cluster_run):
    args, run_dir, last, nodes, actors = cluster_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/num_samples"] == 8 and "train/pg_loss" in r
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-4  # the engine on the other node got the weights
        assert r["perf/train_offload_bytes"] > 0  # --offload-train on the trainer's node


def test_a_run_larger_than_the_cluster_stops_naming_each_nodes_cpus(two_node_cluster, cluster_run, monkeypatch):
    """RAY_ADDRESS: the check uses the cluster's resources (2 nodes x 1 CPU here), before any actor starts."""
    import ray

    from slime.errors import SlimeError
    from slime.ray.placement_group import init_ray
    from tests.helpers import make_args

    address, env = two_node_cluster
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", env["RAY_AUTH_TOKEN_PATH"])
    monkeypatch.delenv(ENABLE_CLUSTERS, raising=False)
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    args = make_args("--actor-num-gpus-per-node", "2", "--rollout-batch-size", "2")
    try:
        with pytest.raises(SlimeError) as e:
            init_ray(args)
    finally:
        ray.shutdown()
    msg = str(e.value)
    assert "3 core(s) needed, but the Ray cluster at RAY_ADDRESS=" in msg and "has 2 CPU (" in msg
    assert msg.count(": 1 CPU") == 2  # one entry per node
