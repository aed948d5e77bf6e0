"""Engines behind a router, with real processes: sglang-router (policies, membership, session
affinity), the built-in fallback dispatcher, and an engine killed mid-run."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import httpx
import pytest

from slime.arguments import parse_args
from slime.ray.engine_watcher import EngineWatcher
from slime.ray.router import check_router_args, start_router
from slime.utils.http_utils import post, session_headers
from tests.engine.engine_test_utils import run_async as _run
from tests.engine.engine_test_utils import start_engine

# engine server and router processes
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def two_engines(tiny_model_dir, tmp_path_factory):
    engines = [start_engine(tiny_model_dir, log_dir=tmp_path_factory.mktemp(f"engine{i}")) for i in range(2)]
    yield engines
    for e in engines:
        e.stop()


def _router(tmp_path, model_dir, policy: str, urls: list[str]):
    return start_router(urls, policy=policy, model_path=str(model_dir), log_dir=tmp_path / "logs")


def _rows(engines) -> list[int]:
    return [httpx.get(e.url + "/get_server_info").json()["stats"]["rows_run"] for e in engines]


def _gen(ids, max_new_tokens=4):
    return {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens, "temperature": 1.0},
        "return_logprob": True,
    }


def _listen_ips(port: int) -> set[str]:
    """IPs with a listening TCP socket on `port` (from /proc/net/tcp{,6})."""
    ips = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            ip_hex, port_hex = local.rsplit(":", 1)
            if state != "0A" or int(port_hex, 16) != port:
                continue
            if len(ip_hex) == 8:
                ips.add(".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                ips.add("::" if set(ip_hex) == {"0"} else ip_hex)
    return ips


def _session_spread(router_url, engines, sessions: int, per_session: int) -> list[list[int]]:
    """Per session, how many rows each engine ran for it (requests sent one after another)."""
    spread = []
    for s in range(sessions):
        before = _rows(engines)
        for k in range(per_session):
            _run(post(router_url + "/generate", _gen([7, 8, 9 + k]), headers=session_headers(f"traj-{s}")))
        spread.append([b - a for a, b in zip(before, _rows(engines), strict=True)])
    return spread


def test_sglang_router_serves_both_engines_and_binds_loopback(two_engines, tiny_model_dir, tmp_path):
    urls = [e.url for e in two_engines]
    router = _router(tmp_path, tiny_model_dir, "round_robin", urls)
    try:
        assert router.kind == "sglang-router"
        assert sorted(router.worker_urls()) == sorted(urls)
        before = _rows(two_engines)

        async def many():
            return await asyncio.gather(*(post(router.url + "/generate", _gen([[5, 6, k]] * 2)) for k in range(8)))

        outs = _run(many())
        assert all(len(o) == 2 and o[0]["meta_info"]["completion_tokens"] == 4 for o in outs)
        served = [b - a for a, b in zip(before, _rows(two_engines), strict=True)]
        assert sum(served) == 16 and all(n > 0 for n in served), served
        assert httpx.post(router.url + "/flush_cache").status_code == 200
        # the router, its metrics port and the engines listen on loopback only
        for port in (router.port, router.metrics_port, *(e.port for e in two_engines)):
            assert _listen_ips(port) == {"127.0.0.1"}, (port, _listen_ips(port))
    finally:
        router.stop()


@pytest.mark.parametrize("policy", ["consistent_hashing", "manual"])
def test_session_affinity_by_routing_key(two_engines, tiny_model_dir, tmp_path, policy):
    """Both policies guarantee stickiness: every request of a session lands on one engine. How
    sessions spread over engines is not guaranteed (`manual` may put every new key on the same
    engine), so only stickiness is asserted here."""
    router = _router(tmp_path, tiny_model_dir, policy, [e.url for e in two_engines])
    try:
        spread = _session_spread(router.url, two_engines, sessions=8, per_session=3)
    finally:
        router.stop()
    assert all(sorted(s) == [0, 3] for s in spread), spread


def test_fallback_dispatcher_without_sglang_router(two_engines, tiny_model_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "sglang_router", None)  # `import sglang_router` now fails
    urls = [e.url for e in two_engines]
    with caplog.at_level(logging.WARNING, logger="slime.ray.router"):
        router = _router(tmp_path, tiny_model_dir, "round_robin", urls)
    try:
        assert router.kind == "builtin-dispatcher"
        assert [r.message for r in caplog.records if "sglang-router is not installed" in r.message]
        assert _listen_ips(router.port) == {"127.0.0.1"}
        before = _rows(two_engines)
        for k in range(4):  # round robin: 2 requests each
            _run(post(router.url + "/generate", _gen([5, 6, k])))
        assert [b - a for a, b in zip(before, _rows(two_engines), strict=True)] == [2, 2]
        flushed = httpx.post(router.url + "/flush_cache").json()
        assert flushed["success"] and sorted(flushed["workers"]) == sorted(urls)
        spread = _session_spread(router.url, two_engines, sessions=6, per_session=2)
        assert all(sorted(s) == [0, 2] for s in spread), spread
        # membership: remove one engine, everything goes to the other; add it back
        assert router.remove_worker(urls[1]) and router.worker_urls() == [urls[0]]
        before = _rows(two_engines)
        for k in range(3):
            _run(post(router.url + "/generate", _gen([5, 6, k])))
        assert [b - a for a, b in zip(before, _rows(two_engines), strict=True)] == [3, 0]
        router.add_worker(urls[1])
        assert sorted(router.worker_urls()) == sorted(urls)
        bad = httpx.post(router.url + "/generate", json={"input_ids": [1], "sampling_params": {"nope": 1}})
        assert bad.status_code == 400  # the engine's 400 comes back as it is
    finally:
        router.stop()


@pytest.mark.parametrize("fallback", [False, True], ids=["sglang-router", "dispatcher"])
def test_engine_killed_mid_run_is_removed_and_requests_are_retried(
    two_engines, tiny_model_dir, tmp_path, monkeypatch, fallback
):
    if fallback:
        monkeypatch.setitem(sys.modules, "sglang_router", None)
    doomed = start_engine(tiny_model_dir, "--step-delay-ms", "20", log_dir=tmp_path)
    survivor = two_engines[0]
    router = _router(tmp_path, tiny_model_dir, "consistent_hashing", [survivor.url, doomed.url])
    watcher = EngineWatcher(router, [survivor.url, doomed.url], interval=0.3).start()
    try:
        doomed_before = _rows([doomed])[0]

        async def rollout():
            async def one(i):
                return await post(
                    router.url + "/generate",
                    _gen([4, 5, i], max_new_tokens=24),
                    retry_interval=0.3,
                    headers=session_headers(f"s{i}"),
                )

            tasks = [asyncio.create_task(one(i)) for i in range(12)]
            await asyncio.sleep(0.4)
            in_flight = httpx.get(doomed.url + "/get_load").json()["num_reqs"]
            os.kill(doomed.pid, signal.SIGKILL)  # a crash, mid-decode
            return in_flight, await asyncio.gather(*tasks)

        in_flight, outs = _run(rollout())
        # the doomed engine had work in flight when it died, and no request was lost
        assert doomed_before == 0 and in_flight > 0 and doomed.proc.wait(timeout=10) == -signal.SIGKILL
        assert len(outs) == 12 and all(o["meta_info"]["completion_tokens"] == 24 for o in outs)
        deadline = time.time() + 10
        while watcher.removed != [doomed.url] and time.time() < deadline:
            time.sleep(0.1)
        assert watcher.removed == [doomed.url]
        assert router.worker_urls() == [survivor.url]
        out = _run(post(router.url + "/generate", _gen([1, 2, 3]), headers=session_headers("s1")))
        assert out["meta_info"]["completion_tokens"] == 4
    finally:
        watcher.stop()
        router.stop()
        doomed.stop()


def test_multi_turn_trajectory_stays_on_one_engine(two_engines, tiny_model_dir, tmp_path):
    """run_multi_turn sends every turn with the trajectory's session_id as routing key: with
    consistent_hashing all turns of one trajectory run on one engine (its prefix cache).
    Fixed session ids keep the hash placement, and so the test, deterministic."""
    from slime.arguments import parse_args
    from slime.rollout.multi_turn import run_multi_turn
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.types import Sample

    router = _router(tmp_path, tiny_model_dir, "consistent_hashing", [e.url for e in two_engines])
    GenerateState.reset()
    try:
        args = parse_args(
            [
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--prompt-data",
                "unused.jsonl",
                "--rm-type",
                "math",
                "--num-rollout",
                "1",
                "--rollout-batch-size",
                "1",
                "--sglang-router-ip",
                router.host,
                "--sglang-router-port",
                str(router.port),
                "--run-dir",
                str(tmp_path),
            ]
        )
        params = dict(GenerateState(args).sampling_params, max_new_tokens=64, ignore_eos=True)
        spread = []
        for i in range(6):
            before = _rows(two_engines)
            out = _run(
                run_multi_turn(
                    args,
                    Sample(prompt=f"{i}+{i}=", session_id=f"traj-{i}"),
                    params,
                    lambda text, traj: "<ok>",
                    max_turns=3,
                    max_new_tokens_per_turn=2,
                )
            )
            assert sum(t["role"] == "model" for t in out.metadata["turns"]) == 3
            spread.append([b - a for a, b in zip(before, _rows(two_engines), strict=True)])
    finally:
        router.stop()
        GenerateState.reset()
    assert all(sorted(s) == [0, 3] for s in spread), spread  # each trajectory: 3 turns, one engine
    assert {s.index(3) for s in spread} == {0, 1}, spread  # and trajectories spread over both


def test_router_options_reach_sglang_router(two_engines, tiny_model_dir, tmp_path):
    """slime's --router-<arg> options go to sglang-router's own parser: --router-max-payload-size
    makes it refuse a larger request body, and the command line shows it."""
    urls = [e.url for e in two_engines]
    args = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--router-max-payload-size", "300"])
    assert args.router_args == ["--max-payload-size", "300"]
    assert check_router_args(args.router_args) is None
    router = start_router(
        urls,
        policy="round_robin",
        model_path=str(tiny_model_dir),
        log_dir=tmp_path / "logs",
        extra_args=args.router_args,
    )
    try:
        small = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(router.url + "/generate", json=small, timeout=30).status_code == 200
        big = {"input_ids": list(range(5, 200)), "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(router.url + "/generate", json=big, timeout=30).status_code == 413
        assert "--max-payload-size 300" in router.log_path.read_text().splitlines()[0]
    finally:
        router.stop()


@pytest.mark.parametrize("fallback", [False, True], ids=["sglang-router", "dispatcher"])
def test_router_and_engines_need_the_runs_key(tiny_model_dir, tmp_path, monkeypatch, fallback):
    """The run's key: clients need it at the router (401 without, membership included), the router
    passes its own key on to the engines, and the rollout client sends it once registered."""
    from slime.utils import api_keys

    if fallback:
        monkeypatch.setitem(sys.modules, "sglang_router", None)
    key = api_keys.new_key()
    monkeypatch.setenv(api_keys.ENV_API_KEY, key)  # the engine reads it from its environment
    engine = start_engine(tiny_model_dir, "--step-delay-ms", "30", log_dir=tmp_path)
    monkeypatch.delenv(api_keys.ENV_API_KEY)
    router = start_router(
        [engine.url],
        policy="round_robin",
        model_path=str(tiny_model_dir),
        log_dir=tmp_path / "logs",
        api_key=key,
        admin_api_key=key,
    )
    auth = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(timeout=30, trust_env=False) as h:
            assert h.post(engine.url + "/generate", json=_gen([1, 2])).status_code == 401
            assert h.post(router.url + "/generate", json=_gen([1, 2])).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert h.post(router.url + "/generate", json=_gen([1, 2]), headers=wrong).status_code == 401
            assert h.post(router.url + "/workers", json={"url": "http://10.1.2.3:80"}).status_code == 401
            assert h.get(router.url + "/workers").status_code == 401
            assert h.post(router.url + "/flush_cache").status_code == 401
            out = h.post(router.url + "/generate", json=_gen([1, 2]), headers=auth)
            assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 4
            assert router.worker_urls() == [engine.url]  # the framework's own membership calls carry the key
            if fallback:  # the dispatcher's own checks, as the engine's
                assert (
                    h.post(
                        router.url + "/generate", content=b"{}", headers={"content-type": "text/plain", **auth}
                    ).status_code
                    == 415
                )
                evil = {"Origin": "http://evil.example", **auth}
                assert h.post(router.url + "/generate", json=_gen([1]), headers=evil).status_code == 403
                big = b'{"x": "' + b"a" * (257 * 1024**2) + b'"}'
                assert (
                    h.post(
                        router.url + "/generate", content=big, headers={"content-type": "application/json", **auth}
                    ).status_code
                    == 413
                )
        impatient = httpx.Client(timeout=httpx.Timeout(1.0, connect=5.0), trust_env=False)
        with impatient, pytest.raises(httpx.ReadTimeout):  # 200 steps x 30 ms
            impatient.post(router.url + "/generate", json=_gen([1], max_new_tokens=200), headers=auth)
        deadline = time.monotonic() + 4  # the client left: the engine stops generating for it
        while httpx.get(engine.url + "/get_load", headers=auth).json()["num_reqs"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(engine.url + "/get_load", headers=auth).json()["num_reqs"] == 0
        with pytest.raises(Exception, match="401"):  # not registered: post() sends no key
            _run(post(router.url + "/generate", _gen([3]), max_retries=1))
        api_keys.register([router.url], key, key)
        assert _run(post(router.url + "/generate", _gen([3])))["meta_info"]["completion_tokens"] == 4
    finally:
        router.stop()
        engine.stop()
