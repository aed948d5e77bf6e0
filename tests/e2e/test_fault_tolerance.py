"""Fault injection with real processes (--use-fault-tolerance): engines SIGKILLed or SIGSTOPped and the
router SIGKILLed in the middle of a rollout. The rollout step completes with every sample of every prompt
(none lost, none twice), and a restarted engine serves the current weights (the trainer's snapshot, not
the checkpoint's). A dead trainer rank ends the call at once, naming the rank and the checkpoint.

Each test prints one `FAULT-TABLE` line (fault, what was observed, samples lost, recovery time): the
table in docs/fault-tolerance.md ("Measured recovery") comes from them (`pytest -s -k fault`).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

BATCH, N = 8, 4  # prompts per rollout, samples per prompt
INTERVAL = TIMEOUT = 2.0  # --rollout-health-check-interval / -timeout of these tests


def _args(tiny_model_dir, task_dir, run_dir, engines: int, *extra: str):
    from tests.helpers import make_args

    return make_args(
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
        "--rollout-batch-size",
        str(BATCH),
        "--n-samples-per-prompt",
        str(N),
        "--rollout-max-response-len",
        "48",
        "--rollout-num-gpus",
        str(engines),
        "--sglang-step-delay-ms",
        "40",  # a rollout of a few seconds
        "--use-fault-tolerance",
        "--rollout-health-check-interval",
        str(INTERVAL),
        "--rollout-health-check-timeout",
        str(TIMEOUT),
        "--run-dir",
        str(run_dir),
        "--debug-rollout-only",  # engines only (no trainer slot): two engines fit a 2-core machine
        *extra,
    )


class Fleet:
    """A RolloutManager with its engines (and router), as the train loop has it."""

    def __init__(self, args):
        from slime.ray.placement_group import create_placement
        from slime.ray.rollout import RolloutManager
        from slime.utils.api_keys import register

        self.args = args
        self.placement = create_placement(args)
        self.manager = RolloutManager.options(num_cpus=0).remote(args, self.placement)
        ray.get(self.manager.init.remote())
        self.urls = ray.get(self.manager.get_engine_urls.remote())
        register(self.urls, args.engine_api_key, args.engine_admin_api_key)

    def pids(self) -> list[int]:
        return ray.get(self.manager.engine_pids.remote())

    def close(self):
        from ray.util.placement_group import remove_placement_group

        try:
            ray.get(self.manager.dispose.remote(), timeout=60)
        finally:
            ray.kill(self.manager)
            remove_placement_group(self.placement.pg)


@pytest.fixture
def fleet_factory(ray_cluster, tiny_model_dir, task_dir, tmp_path):
    made = []

    def make(engines: int) -> Fleet:
        f = Fleet(_args(tiny_model_dir, task_dir, tmp_path / f"run{len(made)}", engines))
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


# ------------------------------------------------------------------------------------- helpers
TOKENS = [1, 17, 42, 99, 7, 3, 64, 12, 5, 33]


def _logprobs(url: str) -> list[float]:
    from slime.sync.tensor import engine_sequence_log_probs

    return engine_sequence_log_probs(url, TOKENS)


def _version(url: str) -> str:
    from slime.engine.client import client_for

    return client_for(url)._call("GET", "/get_weight_version")["weight_version"]


def _sync_new_weights(fleet: Fleet, tiny_model_dir, version: str) -> None:
    """What the trainer's update_weights does under --use-fault-tolerance: push the (here: perturbed)
    weights to every engine and write the snapshot a restarted engine loads."""
    import torch

    from slime.engine.model_runner import ModelRunner
    from slime.sync.tensor import push_weights
    from slime.utils.checkpoint_layout import write_weight_snapshot

    gen = torch.Generator().manual_seed(0)
    state = {
        k: (v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v)
        for k, v in ModelRunner.read_safetensors_dir(str(tiny_model_dir)).items()
    }
    push_weights(fleet.urls, state, weight_version=version)
    write_weight_snapshot(fleet.args.run_dir, state, version)


def _in_flight(url: str) -> int:
    from slime.engine.client import client_for

    return int(client_for(url).get_load()["num_reqs"])


def _generate_with_fault(fleet: Fleet, fault, rollout_id: int = 0, target: int = 0) -> tuple[dict, dict, float, int]:
    """Run a rollout; once engine `target` has requests in flight, inject `fault` (returns when).
    Returns (train data, metrics, fault time, requests in flight at the fault)."""
    ref = fleet.manager.generate.options(num_returns=2).remote(rollout_id)
    url = fleet.urls[target]
    deadline = time.monotonic() + 60
    while _in_flight(url) == 0:
        assert time.monotonic() < deadline, "the rollout never reached the engine"
        time.sleep(0.05)
    in_flight = _in_flight(url)
    t_fault = fault()
    data, metrics = ray.get(ref[0]), ray.get(ref[1])
    return data, metrics, t_fault, in_flight


def _assert_every_sample_once(data: dict, metrics: dict) -> int:
    """Every prompt of the batch has all its samples, each once, none failed; returns samples lost (0)."""
    indices = data["sample_indices"]
    first = min(indices)
    assert sorted(indices) == list(range(first, first + BATCH * N)), indices  # none lost, none twice
    assert sum(data["excluded"]) == 0 and all(n > 0 for n in data["response_lengths"])
    assert metrics.get("rollout/status/failed", 0) == 0
    return BATCH * N - len(set(indices))


def _events(fleet: Fleet, what: str, n: int = 1, wait: float = 0.0) -> list[dict]:
    deadline = time.monotonic() + wait
    while True:
        events = [e for e in ray.get(fleet.manager.fault_events.remote()) if e["what"] == what]
        if len(events) >= n or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def _table(fault: str, observed: str, lost: int, recovered_s: float | None) -> None:
    took = "-" if recovered_s is None else f"{recovered_s:.1f} s"
    print(f"\nFAULT-TABLE | {fault} | {observed} | {lost} | {took} |")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------------------ the whole loop
def _engine_pids_of(run_dir) -> list[int]:
    """The built-in engine servers of one run: the only processes whose command line names its snapshot
    directory (--weight-load-dirs <run_dir>/fault_tolerance/weights)."""
    mark = str(run_dir / "fault_tolerance" / "weights").encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"slime.engine.server" in cmd and mark in cmd:
            pids.append(int(pid))
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_colocated_run_survives_an_engine_sigkilled_after_the_first_step(tiny_model_dir, task_dir, tmp_path, lora):
    """`slime train --colocate --use-fault-tolerance` with two engines: one is SIGKILLed once step 0 is
    logged. The run finishes; every step has all its samples; after the restart the weight sync reached
    both engines (--check-weight-update-equal: engine and trainer log-probs agree), and the restarted engine
    got the trainer's snapshot of the weights it had pushed. With LoRA the syncs move the adapter alone:
    the restarted engine comes back with the merged snapshot and no base, so the next sync sends the base
    again (an adapter alone would be refused)."""
    import json
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "slime",
        "train",
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
        "--rollout-batch-size",
        str(BATCH),
        "--n-samples-per-prompt",
        str(N),
        "--rollout-max-response-len",
        "24",
        "--global-batch-size",
        str(BATCH * N),
        "--micro-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--colocate",
        "--rollout-num-gpus",
        "2",
        "--num-rollout",
        "2",
        "--check-weight-update-equal",
        "--sglang-step-delay-ms",
        "20",
        "--use-fault-tolerance",
        "--rollout-health-check-interval",
        str(INTERVAL),
        "--rollout-health-check-timeout",
        str(TIMEOUT),
        "--run-dir",
        str(run_dir),
        *(["--enable-lora", "--lora-rank", "8", "--lr", "1e-2"] if lora else []),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    killed = None
    try:
        deadline = time.monotonic() + 180
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and metrics.read_text().strip():
                pids = sorted(_engine_pids_of(run_dir))
                assert len(pids) == 2, pids
                os.kill(pids[0], signal.SIGKILL)
                killed = (pids[0], time.time())
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed is not None, "the run ended before step 0 was logged"
    assert proc.returncode == 0, out[-4000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        assert r["rollout/num_samples"] == BATCH * N and r["rollout/status/failed"] == 0
        assert r["train/weight_sync_logprob_abs_diff"] < 1e-4  # every engine, the restarted one too
    assert sum(r.get("rollout/fault/restarts", 0) for r in rows) <= 1
    if lora:  # the adapter alone, then the base again for the restarted engine
        assert [r["perf/weight_sync_lora_base"] for r in rows] == [0.0, 1.0]
        assert rows[0]["perf/weight_sync_bytes"] < rows[1]["perf/weight_sync_bytes"] / 5
    assert "is dead (connection failed" in out and "restarting it" in out and "is back after" in out, out[-4000:]
    _table(
        "SIGKILL one of two engines of a colocated `slime train` run after step 0",
        "run finished (2 steps); the engine was restarted and got the snapshot; weight sync parity "
        f"{max(r['train/weight_sync_logprob_abs_diff'] for r in rows):.1e} on both engines",
        0,
        None,
    )


# --------------------------------------------------------------------------------------- tests
@pytest.mark.slow
def test_two_engines_survive_sigkill_sigstop_and_a_router_kill(fleet_factory, tiny_model_dir):
    """Rollout 0: engine 0 SIGKILLed; rollout 1: engine 1 SIGSTOPped (hung); rollout 2: the router
    SIGKILLed. Every rollout completes with all its samples; each engine comes back at its address
    serving the current weights (the trainer's snapshot, weight_version 3, not the checkpoint's)."""
    fleet = fleet_factory(2)
    base = _logprobs(fleet.urls[0])
    _sync_new_weights(fleet, tiny_model_dir, "3")
    current = _logprobs(fleet.urls[1])
    assert max(abs(a - b) for a, b in zip(base, current, strict=True)) > 1e-3  # the new weights are visible

    # 1. SIGKILL engine 0 mid-rollout: its requests fail over to engine 1
    old_pid = fleet.pids()[0]

    def kill():
        os.kill(old_pid, signal.SIGKILL)
        return time.time()

    data, metrics, t_kill, in_flight = _generate_with_fault(fleet, kill, 0, target=0)
    lost = _assert_every_sample_once(data, metrics)
    assert in_flight > 0 and lost == 0
    by = "the monitor, during the rollout"
    if metrics["rollout/fault/restarts"] == 0:
        # engine 1 finished the rollout before the next check; the loop's check before the weight
        # sync restarts it (what train.py does next)
        assert ray.get(fleet.manager.recover_engines.remote()) == 1
        by = "the check before the weight sync"
    [event] = _events(fleet, "engine")
    assert event["ok"] and event["url"] == fleet.urls[0] and event["reason"].startswith("dead")
    assert fleet.pids()[0] != old_pid and _gone(old_pid)
    assert _version(fleet.urls[0]) == "3"
    assert _logprobs(fleet.urls[0]) == pytest.approx(current, abs=1e-4)
    _table(
        "SIGKILL one of two engines mid-rollout",
        f"{in_flight} requests in flight; detected by {by} {event['detected_at'] - t_kill:.1f} s later "
        f"({event['reason']}); retried on the other engine; restarted at the same address with weight_version 3",
        lost,
        event["detected_at"] - t_kill + event["recovered_s"],
    )

    # 2. SIGSTOP engine 1 mid-rollout: hung, found by the health check's timeout, killed and replaced
    old_pid = fleet.pids()[1]

    def stop():
        os.kill(old_pid, signal.SIGSTOP)  # the port still accepts connections; nothing answers
        return time.time()

    try:
        data, metrics, t_stop, in_flight = _generate_with_fault(fleet, stop, 1, target=1)
    finally:
        if not _gone(old_pid):
            os.kill(old_pid, signal.SIGCONT)
    lost = _assert_every_sample_once(data, metrics)
    event = _events(fleet, "engine", 2)[1]
    detected = event["detected_at"] - t_stop
    assert event["ok"] and event["url"] == fleet.urls[1] and event["reason"].startswith("hung"), event
    # at most one interval until the next check, then the check's timeout (and scheduling slack)
    assert detected <= INTERVAL + TIMEOUT + 2.0, detected
    assert _gone(old_pid) and _version(fleet.urls[1]) == "3"
    assert _logprobs(fleet.urls[1]) == pytest.approx(current, abs=1e-4)
    _table(
        "SIGSTOP one of two engines mid-rollout (hang)",
        f"{in_flight} requests in flight; no /health_generate answer in {TIMEOUT:g} s: detected "
        f"{detected:.1f} s after the stop, killed, its requests retried on the other engine, restarted "
        "with weight_version 3",
        lost,
        detected + event["recovered_s"],
    )

    # 3. SIGKILL the router mid-rollout: replaced at its address; the clients' retries go through
    router_pid = ray.get(fleet.manager.router_pid.remote())

    def kill_router():
        os.kill(router_pid, signal.SIGKILL)
        return time.time()

    data, metrics, t_kill, in_flight = _generate_with_fault(fleet, kill_router, 2, target=0)
    lost = _assert_every_sample_once(data, metrics)
    [event] = _events(fleet, "router")
    assert event["ok"] and event["reason"].startswith("dead"), event
    assert ray.get(fleet.manager.router_pid.remote()) != router_pid and _gone(router_pid)
    _table(
        "SIGKILL the router mid-rollout",
        f"{in_flight} requests in flight on an engine; detected {event['detected_at'] - t_kill:.1f} s later; "
        "restarted at the same address with both engines; the clients' retries went through",
        lost,
        event["detected_at"] - t_kill + event["recovered_s"],
    )


def test_the_only_engine_sigkilled_mid_rollout_and_between_rollouts(fleet_factory, tiny_model_dir):
    """No router: requests wait (retrying) for the restarted engine. An engine that dies while no
    rollout runs (the monitor is paused) is restarted by the check the loop makes before each weight
    sync, so the sync reaches every engine."""
    fleet = fleet_factory(1)
    _sync_new_weights(fleet, tiny_model_dir, "3")
    current = _logprobs(fleet.urls[0])
    old_pid = fleet.pids()[0]

    def kill():
        os.kill(old_pid, signal.SIGKILL)
        return time.time()

    data, metrics, t_kill, in_flight = _generate_with_fault(fleet, kill)
    lost = _assert_every_sample_once(data, metrics)
    assert in_flight > 0 and lost == 0 and metrics["rollout/fault/restarts"] == 1
    [event] = _events(fleet, "engine")
    assert event["ok"] and event["reason"].startswith("dead")
    assert fleet.pids()[0] != old_pid and _gone(old_pid) and _version(fleet.urls[0]) == "3"
    assert _logprobs(fleet.urls[0]) == pytest.approx(current, abs=1e-4)
    _table(
        "SIGKILL the only engine mid-rollout",
        f"{in_flight} requests in flight; detected {event['detected_at'] - t_kill:.1f} s later; requests "
        "retried until the engine was back at its address with weight_version 3",
        lost,
        event["detected_at"] - t_kill + event["recovered_s"],
    )

    assert ray.get(fleet.manager.recover_engines.remote()) == 1  # reported once, before the next sync
    old_pid = fleet.pids()[0]
    os.kill(old_pid, signal.SIGKILL)
    time.sleep(INTERVAL + 0.5)
    assert len(_events(fleet, "engine")) == 1  # paused outside generate/eval
    assert ray.get(fleet.manager.recover_engines.remote()) == 1
    assert fleet.pids()[0] != old_pid and _version(fleet.urls[0]) == "3"


# ------------------------------------------------------------------------------ a dead trainer rank
@ray.remote
class _Rank:
    def __init__(self, die: bool):
        self.die = die

    def train(self) -> None:
        if self.die:
            time.sleep(0.5)
            os._exit(1)  # the process dies (OOM killer, segfault, SIGKILL)
        time.sleep(120)  # the survivor waits in a collective for the dead one


def test_a_dead_trainer_rank_ends_the_call_at_once_naming_the_rank_and_the_checkpoint(ray_cluster, tmp_path):
    from slime.errors import SlimeError
    from slime.ray.train_group import RayTrainGroup
    from tests.helpers import make_args

    save = tmp_path / "ckpt"
    (save / "iter_0000004").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("4")
    group = object.__new__(RayTrainGroup)  # the real group's call path, over stand-in ranks
    group.args = make_args("--save", str(save))
    group.actors = [_Rank.options(num_cpus=0).remote(die=False), _Rank.options(num_cpus=0).remote(die=True)]
    t0 = time.monotonic()
    try:
        with pytest.raises(SlimeError) as e:
            group._all("train")
    finally:
        for a in group.actors:
            ray.kill(a)
    assert time.monotonic() - t0 < 30  # not the collective's timeout
    msg = str(e.value)
    assert "trainer rank 1 of 2 died during train" in msg and "--distributed-timeout-minutes 10" in msg
    assert f"--load {save}" in msg and "iter_0000004" in msg
    _table(
        "a trainer rank dies (os._exit) mid-step",
        "the call ends at once: 'trainer rank 1 of 2 died during train ... resume ... --load'",
        0,
        time.monotonic() - t0,
    )
