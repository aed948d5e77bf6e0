"""Placement on CPU (a slime "GPU" slot is a share of a node's cores), slime's offload options and
their rules, and --offload-train's bit-exact round trip of a real TrainActor's optimizer state.
(The placement on a real Ray cluster, with processes pinned: tests/e2e/test_pinning.py, and on two
nodes tests/e2e/test_multi_node.py.)"""

from __future__ import annotations

import os
from argparse import Namespace

import pytest
import torch

from slime.arguments import parse_args
from slime.errors import SlimeError
from slime.ray.placement_group import _assign_cores, check_fits, num_bundles
from slime.runtime.cores import format_cores, pin_to_cores, split_cores

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]


# ------------------------------------------------------------------------------------ slime's option rules
@pytest.mark.parametrize(
    "argv, train, rollout",
    [
        ([], False, False),  # slime: both default to off
        (["--offload"], True, True),  # --offload = both
        (["--offload-train"], True, False),
        (["--offload-rollout"], False, True),
        (["--colocate"], True, True),  # colocate turns both on ...
        (["--colocate", "--no-offload-train"], False, True),  # ... unless told otherwise
        (["--colocate", "--no-offload-rollout"], True, False),
        (["--colocate", "--debug-rollout-only"], False, False),  # no trainer to take turns with
        (["--offload", "--debug-rollout-only"], False, False),
        (["--advantage-estimator", "ppo", "--hf-checkpoint", "/m"], True, False),  # slime: the critic forces it
    ],
)
def test_offload_options_follow_slimes_rules(argv, train, rollout):
    a = parse_args(BASE + argv)
    assert (a.offload_train, a.offload_rollout) == (train, rollout)


def test_release_train_is_refused_as_slime_refuses_it_without_megatron():
    with pytest.raises(SlimeError, match=r"--release-train is only supported with the Megatron train backend"):
        parse_args(BASE + ["--release-train"])


def test_colocated_engines_may_not_straddle_two_trainer_nodes():
    with pytest.raises(
        SlimeError, match=r"--rollout-num-gpus-per-engine 2 does not divide --actor-num-gpus-per-node 3"
    ):
        parse_args(
            BASE
            + [
                "--colocate",
                "--actor-num-nodes",
                "2",
                "--actor-num-gpus-per-node",
                "3",
                "--rollout-num-gpus-per-engine",
                "2",
            ]
        )
    a = parse_args(
        [
            "--rollout-batch-size",
            "4",
            "--num-rollout",
            "1",
            "--colocate",
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "2",
            "--rollout-num-gpus-per-engine",
            "2",
        ]
    )
    assert (a.actor_world_size, a.rollout_num_gpus, a.num_engines) == (4, 4, 2)


# ------------------------------------------------------------------------------------ cores
def test_split_cores_gives_contiguous_disjoint_shares_in_proportion_to_slots():
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    shares = split_cores(cores, [1, 1, 2])  # two trainer ranks, one engine of two slots
    assert shares == [(0, 1), (2, 3), (4, 5, 6, 7)]
    # reference: every core in exactly one share, each share's size = cores * slots / total slots
    for weights in ([1], [1, 1], [1, 2, 1], [3, 1], [1] * 8, [2, 2, 2, 2]):
        shares = split_cores(cores, weights)
        assert sorted(c for s in shares for c in s) == cores
        assert [len(s) for s in shares] == [len(cores) * w // sum(weights) for w in weights]
    assert split_cores([0, 1], [1, 1, 1]) is None  # more slots than cores: no pinning
    assert split_cores([5, 3, 4], [1, 2]) == [(3,), (4, 5)]
    assert format_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def _plan(argv, nodes: dict[str, list[int]], bundle_node: list[str]):
    """_assign_cores for the processes create_placement would start, bundles on the given nodes."""
    args = parse_args(BASE + argv)
    actors = 0 if args.debug_rollout_only else args.actor_world_size
    per = args.rollout_num_gpus_per_engine
    first = 0 if args.colocate else actors
    units = [("trainer", f"trainer rank {r}", [r]) for r in range(actors)]
    units += [
        ("engine", f"engine {e}", list(range(first + e * per, first + (e + 1) * per)))
        for e in range(args.rollout_num_gpus // per)
    ]
    assert len(bundle_node) == num_bundles(args)
    return _assign_cores(
        args,
        units,
        dict(enumerate(bundle_node)),
        dict.fromkeys(nodes, "10.0.0.1"),
        {n: tuple(c) for n, c in nodes.items()},
    )


def test_disaggregated_processes_split_the_node_and_colocated_sides_share_it():
    four = {"a": [0, 1, 2, 3]}
    p = _plan(
        ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"],
        four,
        ["a"] * 4,
    )
    assert [(x.role, x.cores, x.threads) for x in p] == [
        ("trainer rank 0", (0,), 1),
        ("trainer rank 1", (1,), 1),
        ("engine 0", (2, 3), 2),
    ]
    # colocated: trainer ranks split the node among themselves, engines too (they take turns)
    p = _plan(["--colocate", "--actor-num-gpus-per-node", "2"], four, ["a"] * 2)
    assert [(x.role, x.cores) for x in p] == [
        ("trainer rank 0", (0, 1)),
        ("trainer rank 1", (2, 3)),
        ("engine 0", (0, 1)),
        ("engine 1", (2, 3)),
    ]
    p = _plan(["--colocate"], four, ["a"])
    assert [(x.cores, x.threads) for x in p] == [((0, 1, 2, 3), 4), ((0, 1, 2, 3), 4)]
    # the user's thread counts win over the share's size
    p = _plan(["--train-num-threads", "3", "--sglang-num-threads", "2"], four, ["a", "a"])
    assert [(x.cores, x.threads) for x in p] == [((0, 1), 3), ((2, 3), 2)]


def test_processes_on_two_nodes_split_each_nodes_cores_and_overcrowded_nodes_are_not_pinned():
    p = _plan(["--rollout-num-gpus", "2"], {"a": [0, 1], "b": [0, 1, 2, 3]}, ["a", "b", "b"])
    assert [(x.role, x.node_id, x.cores) for x in p] == [
        ("trainer rank 0", "a", (0, 1)),
        ("engine 0", "b", (0, 1)),
        ("engine 1", "b", (2, 3)),
    ]
    p = _plan(["--rollout-num-gpus", "2"], {"a": [0], "b": [0]}, ["a", "b", "b"])
    assert [(x.cores, x.threads) for x in p] == [((0,), 1), (None, 1), (None, 1)]
    assert "not pinned (shares cores 0" in p[1].describe()
    assert p[0].describe() == "trainer rank 0: node 10.0.0.1 (a), cores 0, 1 thread(s)"


@pytest.mark.parametrize(
    "argv, need",
    [
        (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2"], 4),
        (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "3", "--colocate"], 3),
    ],
)
def test_more_processes_than_cores_stop_naming_what_was_asked_and_what_there_is(argv, need):
    args = parse_args(BASE + argv)
    assert num_bundles(args) == need
    check_fits(args, need, "enough")  # exactly enough fits
    with pytest.raises(SlimeError) as e:
        check_fits(args, need - 1, f"this machine has {need - 1} core(s)")
    msg = str(e.value)
    assert msg.startswith(
        "cannot place this run: 2 trainer rank(s) (--actor-num-nodes 1 x --actor-num-gpus-per-node 2)"
    )
    assert f"{need} core(s) needed, but this machine has {need - 1} core(s)" in msg
    assert "--rollout-num-gpus" in msg


def test_a_local_cluster_too_small_stops_before_ray_starts(without_shared_ray, monkeypatch):
    import ray

    from slime.ray import placement_group

    monkeypatch.setattr(placement_group, "available_cores", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = parse_args(BASE + ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1"])
    with pytest.raises(SlimeError, match=r"3 core\(s\) needed, but this machine has 2 core\(s\)"):
        placement_group.init_ray(args)
    assert not ray.is_initialized()


def test_pin_to_cores_binds_this_process_and_its_running_threads():
    import threading

    before = os.sched_getaffinity(0)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        assert pin_to_cores([min(before)]) == (min(before),)
        assert os.sched_getaffinity(other.native_id) == {min(before)}  # a thread started earlier too
        assert pin_to_cores(None) == (min(before),)  # None leaves it as it is
    finally:
        pin_to_cores(sorted(before))  # every thread back
        done.set()
        other.join()
    assert os.sched_getaffinity(0) == before


# ------------------------------------------------------------------------------------ --offload-train
DATA = {
    "tokens": [[5, 6, 7, 8, 9], [5, 6, 7, 10, 11], [12, 13, 14, 15], [12, 13, 16, 17, 18, 19]],
    "response_lengths": [2, 2, 2, 3],
    "loss_masks": [[1, 1], [1, 0], [1, 1], [1, 1, 1]],
    "rewards": [1.0, -1.0, 0.5, -0.5],
}


def _actor(tiny_model_dir, run_dir, *extra):
    from slime.backends.torch.actor import TrainActor

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--num-rollout",
            "3",
            "--lr",
            "1e-2",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )
    actor = TrainActor(args, rank=0, world_size=1, master_addr="127.0.0.1", master_port=0, num_threads=1)
    actor.init()
    return actor


def _copy():
    return {k: [list(v) if isinstance(v, list) else v for v in vals] for k, vals in DATA.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8) if t.dim() else t.detach().reshape(1).view(torch.uint8)


@pytest.mark.parametrize("extra", [[], ["--advantage-estimator", "ppo"]])
def test_offload_train_round_trip_is_bit_exact_and_frees_the_optimizer_state(tiny_model_dir, tmp_path, extra):
    """Two actors, same seed: one offloads between steps, one does not. The state comes back bit for
    bit, and the weights after the next steps are bit-identical (policy, and the PPO critic)."""
    plain, off = _actor(tiny_model_dir, tmp_path / "plain", *extra), _actor(tiny_model_dir, tmp_path / "off", *extra)
    for step in range(3):
        m_plain, m_off = plain.train(step, _copy()), off.train(step, _copy())
        untimed = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in (m_plain, m_off)]
        assert untimed[0] == untimed[1]  # (times differ)
        opts = [off.optimizer] + ([off.critic.optimizer] if off.critic else [])
        saved = [{k: _bits(v).clone() for k, v in st.items()} for o in opts for st in o.state.values()]
        stats = off.offload()
        assert stats["offload_bytes"] == sum(v.numel() for s in saved for v in s.values())
        # an unnamed file (unlinked at once): its space, not a name, is in the run directory
        assert os.fstat(off.offload_state._file.fileno()).st_size == stats["offload_bytes"]
        assert list((tmp_path / "off" / "offload").iterdir()) == []
        assert all(v.untyped_storage().nbytes() == 0 for o in opts for st in o.state.values() for v in st.values())
        assert all(p.grad is None for p in off.model.parameters())
        assert off.offload() == {}  # idempotent
        assert off.onload()["onload_bytes"] == stats["offload_bytes"]
        assert off.onload() == {}
        back = [{k: _bits(v) for k, v in st.items()} for o in opts for st in o.state.values()]
        assert all(torch.equal(a[k], b[k]) for a, b in zip(saved, back, strict=True) for k in a)
    a, b = plain.full_state_dict(), off.full_state_dict()
    assert all(torch.equal(_bits(a[k]), _bits(b[k])) for k in a)
    if plain.critic is not None:
        ca, cb = plain.critic.model.state_dict(), off.critic.model.state_dict()
        assert all(torch.equal(_bits(ca[k]), _bits(cb[k])) for k in ca)


def test_offload_frees_memory_measured_as_rss(tmp_path):
    """A 64 MB AdamW state (two moments of 8M fp32 parameters) leaves the process's RSS."""
    from slime.backends.torch.offload import TrainOffload, rss_bytes

    model = torch.nn.Linear(4096, 2048)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4096)).sum().backward()
    opt.step()
    state_bytes = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values())
    assert state_bytes > 64e6
    off = TrainOffload(tmp_path)
    try:
        stats = off.offload([opt], [model])
        assert stats["offload_bytes"] == state_bytes
        assert stats["rss_before"] - stats["rss_after"] > 0.9 * state_bytes
        before_onload = rss_bytes()
        off.onload()
        assert rss_bytes() - before_onload > 0.9 * state_bytes
    finally:
        if off.offloaded:
            off.onload()


def test_the_placement_travels_in_its_own_object_not_in_args():
    """Each engine's cores, threads and lending file reach its actor in its `ProcessPlace`, and the
    engines' addresses stay with the rollout manager: none of it is written into the run's args
    (each Ray actor holds its own copy of them); args made without a placement (tests, tools) keep
    the thread budget start_engine is given."""
    a = parse_args(BASE)
    assert isinstance(a, Namespace)
    for name in ("engine_cores", "engine_threads", "engine_lend_files", "rollout_engine_urls"):
        assert not hasattr(a, name), name


def test_offload_takes_optimizer_state_read_from_a_checkpoint(tmp_path):
    """State restored by torch.load (a resumed run) sits in storages that cannot be resized:
    offload gives those entries their own copies and still round-trips them bit for bit."""
    import io

    from slime.backends.torch.offload import TrainOffload

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    opt.load_state_dict(torch.load(buf, weights_only=True))
    loaded = [v for st in opt.state.values() for v in st.values() if v.dim()]
    assert loaded and not all(v.untyped_storage().resizable() for v in loaded)  # the case under test
    saved = [{k: _bits(v).clone() for k, v in st.items()} for st in opt.state.values()]
    off = TrainOffload(tmp_path)
    assert off.offload([opt], [model])["offload_bytes"] == sum(v.numel() for s in saved for v in s.values())
    off.onload()
    back = [{k: _bits(v) for k, v in st.items()} for st in opt.state.values()]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(saved, back, strict=True) for k in a)


def test_joining_a_cluster_presents_the_token_the_environment_names_now(tmp_path, monkeypatch):
    """Ray caches the auth token per process: a driver that used one token (an earlier local
    cluster) and then joins another cluster (RAY_AUTH_TOKEN_PATH) must present the new one."""
    from ray._raylet import AuthenticationTokenLoader

    from slime.ray.placement_group import _configure_auth

    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("1" * 32)
    second.write_text("2" * 32)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(first))
    try:
        assert _configure_auth(joining=True)
        assert "1" * 32 in str(AuthenticationTokenLoader.instance().get_token_for_http_header())
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(second))
        assert _configure_auth(joining=True)
        assert "2" * 32 in str(AuthenticationTokenLoader.instance().get_token_for_http_header())
    finally:
        monkeypatch.undo()
        AuthenticationTokenLoader.instance().reset_cache()  # later tests read their own token


def test_worker_log_prefixes_are_plain_when_the_output_is_redirected(monkeypatch):
    """Ray colours the `(Actor pid=...)` prefixes it prints on the driver: escape codes in a log file."""
    import io

    from slime.ray.placement_group import plain_logs_when_redirected

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # not a terminal
    plain_logs_when_redirected()
    assert os.environ["RAY_COLOR_PREFIX"] == "0"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("RAY_COLOR_PREFIX")
    monkeypatch.setattr("sys.stdout", Terminal())
    plain_logs_when_redirected()
    assert "RAY_COLOR_PREFIX" not in os.environ
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")  # the user's choice stands
    monkeypatch.setattr("sys.stdout", io.StringIO())
    plain_logs_when_redirected()
    assert os.environ["RAY_COLOR_PREFIX"] == "1"
