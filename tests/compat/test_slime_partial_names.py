"""slime's public names that these modules lacked, by slime's paths, with slime's signatures and
behaviour: checked against hand-computed cases (worked below), brute force over small inputs, and
plain re-derivations of the textbook algorithms written here."""

from __future__ import annotations

import ast
import asyncio
import heapq
import importlib
import inspect
import itertools
import multiprocessing
import random
import signal
import socket
import subprocess
import sys
import time
import types
from types import SimpleNamespace

import pytest
import torch

from slime.errors import SlimeError

# slime's definitions, as written at THUDM/slime commit 624b824 (624b824a898ab0ec1fcb4d373004c7f3852bf515)
SLIME_DEFS = {
    "slime.utils.http_utils": [
        "def find_available_port(base_port: int): ...",
        "def get_host_info(): ...",
        "def run_router(args): ...",
        "def terminate_process(process: multiprocessing.Process, timeout: float = 1.0) -> None: ...",
        "def init_http_client(args): ...",
    ],
    "slime.utils.misc": [
        "def exec_command(cmd: str, capture_output: bool = False) -> str | None: ...",
        "def get_current_node_ip(): ...",
        "def get_free_port(start_port=10000, consecutive=1): ...",
        "def chunk_named_params_by_size(named_params: Iterable[tuple[str, torch.Tensor]], chunk_size: int): ...",
    ],
    "slime.utils.seqlen_balancing": [
        "def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool): ...",
        "def greedy_partition(seqlen_list: list[int], k_partitions: int, equal_size: bool): ...",
        "def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool): ...",
        "def first_fit_pack(total_lengths, max_tokens_per_bin): ...",
        "def expand_bins_by_splitting(bins: list[list[int]], target_count: int, lengths) -> None: ...",
        "def get_reverse_idx(idx_map): ...",
    ],
    "slime.utils.eval_config": [
        "def pick_from_args(args: Any, attrs: tuple[str, ...]) -> Any: ...",
        "def ensure_dataset_list(config: Any) -> list[dict[str, Any]]: ...",
        "def build_eval_dataset_configs(args: Any, raw_config: Iterable[dict[str, Any]], defaults: dict[str, Any]) -> list[EvalDatasetConfig]: ...",
    ],
    "slime.rollout.rm_hub.math_utils": [
        "def count_unknown_letters_in_expr(expr: str): ...",
        "def should_allow_eval(expr: str): ...",
        "def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str): ...",
        "def split_tuple(expr: str): ...",
    ],
}
_CASES = [(module, text) for module, defs in SLIME_DEFS.items() for text in defs]


def _slime_params(text: str) -> tuple[str, list[tuple[str, object]]]:
    """(name, [(parameter, default or "-")]) of one of slime's `def` lines."""
    fn = ast.parse(text).body[0]
    assert isinstance(fn, ast.FunctionDef)
    positional = fn.args.posonlyargs + fn.args.args
    defaults = [ast.literal_eval(d) for d in fn.args.defaults]
    padded = ["-"] * (len(positional) - len(defaults)) + defaults
    return fn.name, [(a.arg, d) for a, d in zip(positional, padded, strict=True)]


@pytest.mark.parametrize(("module", "text"), _CASES, ids=[t.split("(")[0][4:] for _, t in _CASES])
def test_each_name_has_slimes_parameters_and_a_docstring(module, text):
    name, expected = _slime_params(text)
    fn = getattr(importlib.import_module(module), name)
    got = [
        (p.name, "-" if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
    ]
    assert got == expected
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in inspect.signature(fn).parameters.values())
    assert (fn.__doc__ or "").strip(), f"{module}.{name} has no docstring"


# ============================================================== slime.utils.seqlen_balancing

from slime.utils.seqlen_balancing import (  # noqa: E402 - grouped with their tests
    expand_bins_by_splitting,
    first_fit_pack,
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
)


def _sums(lengths, parts):
    return [sum(lengths[i] for i in p) for p in parts]


def _spread(lengths, parts):
    sums = _sums(lengths, parts)
    return max(sums) - min(sums)


def _assert_is_partition(parts, n, k, equal_size):
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(n))
    if equal_size:
        assert {len(p) for p in parts} == {n // k}


def _best_spread(lengths, k, equal_size):
    """Brute force: the smallest max-min over every assignment of items to k parts."""
    best = None
    for labels in itertools.product(range(k), repeat=len(lengths)):
        counts = [labels.count(p) for p in range(k)]
        if equal_size and len(set(counts)) != 1:
            continue
        sums = [sum(x for x, lab in zip(lengths, labels, strict=True) if lab == p) for p in range(k)]
        best = min(best, max(sums) - min(sums)) if best is not None else max(sums) - min(sums)
    return best


def _differencing(numbers):
    """Karmarkar and Karp's two-way differencing, textbook form: replace the two largest numbers by
    their difference until one is left; that one is the difference of the two parts."""
    heap = [-x for x in numbers]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = -heapq.heappop(heap), -heapq.heappop(heap)
        heapq.heappush(heap, -(a - b))
    return -heap[0]


def test_kk_on_the_textbook_example_beats_greedy_but_is_not_optimal():
    # {8,7,6,5,4}: 8,7 -> 1; 6,5 -> 1; {4,1,1}: 4,1 -> 3; 3,1 -> 2. Parts {8,6} and {7,5,4}.
    lengths = [8, 7, 6, 5, 4]
    parts = karmarkar_karp(lengths, 2, False)
    _assert_is_partition(parts, 5, 2, False)
    assert sorted(map(sorted, parts)) == [[0, 2], [1, 3, 4]]
    assert _spread(lengths, parts) == 2
    assert _best_spread(lengths, 2, False) == 0  # {8,7} / {6,5,4}: KK is a heuristic
    # in input order, the smallest-sum greedy gives {8,5,4}=17 / {7,6}=13
    assert _spread(lengths, greedy_partition(lengths, 2, False)) == 4


def test_kk_three_way_textbook_example():
    # k=3 on {8,7,6,5,4}: (8)(7) -> (8,7,0); with (6) -> (8,7,6); (5)(4) -> (5,4,0);
    # (8,7,6) with (5,4,0) reversed: 8+0, 7+4, 6+5 -> sums 11, 11, 8.
    lengths = [8, 7, 6, 5, 4]
    parts = karmarkar_karp(lengths, 3, False)
    assert {frozenset(p) for p in parts} == {frozenset({0}), frozenset({1, 4}), frozenset({2, 3})}
    assert sorted(_sums(lengths, parts)) == [8, 11, 11]
    assert _best_spread(lengths, 3, False) == 3  # KK's result is optimal here
    assert _sums(lengths, parts)[0] == max(_sums(lengths, parts))  # largest part first, as slime's


def test_kk_equal_size_hand_computed():
    # sorted items taken 2 at a time: ({2},{1}) ({4},{3}) ({6},{5}), each spread 1. The one with
    # the largest top part goes first: ({6},{5}) with ({4},{3}) -> {6,3},{5,4} (spread 0); then
    # ({2},{1}) with it: {2}+{5,4} = 11, {1}+{6,3} = 10.
    lengths = [1, 2, 3, 4, 5, 6]
    parts = karmarkar_karp(lengths, 2, True)
    assert [sorted(p) for p in parts] == [[1, 3, 4], [0, 2, 5]]
    assert _sums(lengths, parts) == [11, 10]
    assert _best_spread(lengths, 2, True) == 1


@pytest.mark.parametrize("seed", range(40))
def test_two_way_kk_is_the_differencing_method_and_optimal_up_to_four_items(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(2, 9))]
    parts = karmarkar_karp(lengths, 2, False)
    _assert_is_partition(parts, len(lengths), 2, False)
    assert _spread(lengths, parts) == _differencing(lengths)
    if len(lengths) <= 4:  # two-way differencing is exact for n <= 4
        assert _spread(lengths, parts) == _best_spread(lengths, 2, False)


@pytest.mark.parametrize("seed", range(30))
def test_partitions_hold_every_index_once_with_equal_sizes_when_asked(seed):
    rng = random.Random(100 + seed)
    k = rng.randint(2, 3)
    n = k * rng.randint(1, 3)
    lengths = [rng.randint(0, 30) for _ in range(n)]
    for equal in (True, False):
        kk = karmarkar_karp(lengths, k, equal)
        _assert_is_partition(kk, n, k, equal)
        _assert_is_partition(greedy_partition(lengths, k, equal), n, k, equal)
        assert _spread(lengths, kk) >= _best_spread(lengths, k, equal)  # never better than the optimum
        balanced = get_seqlen_balanced_partitions(lengths, k, equal)
        assert balanced == [sorted(p) for p in kk]
    # equal sizes cost balance, never the other way round
    assert _best_spread(lengths, k, True) >= _best_spread(lengths, k, False)


def test_greedy_partition_hand_computed():
    # in input order, each to the smallest sum (first on a tie): 5->A; 1,1,1->B (3); 4->B (7); 3->A (8)
    assert greedy_partition([5, 1, 1, 1, 4, 3], 2, False) == [[0, 5], [1, 2, 3, 4]]
    # equal sizes: each length weighs 15+1 more, so counts decide: A gets 5, B 1, B (17<21) 1, A 1, B 4, A 3
    assert greedy_partition([5, 1, 1, 1, 4, 3], 2, True) == [[0, 3, 5], [1, 2, 4]]
    with pytest.raises(ValueError):
        greedy_partition([1, 2, 3], 2, True)


def test_balanced_partitions_are_sorted_and_refuse_what_slime_refuses():
    # the larger part (16) first, each sorted
    assert get_seqlen_balanced_partitions([8, 7, 6, 5, 4], 2, False) == [[1, 3, 4], [0, 2]]
    with pytest.raises(ValueError):
        get_seqlen_balanced_partitions([1], 2, False)  # fewer items than partitions
    with pytest.raises(ValueError):
        karmarkar_karp([1, 2, 3], 2, True)  # 3 items do not split into 2 equal parts


def test_first_fit_pack_hand_computed():
    # cap 6: 4->b0; 3 does not fit b0 (7) -> b1; 2 fits b0 (6); 5 fits none -> b2; 1: b0 full (7), b1 (4)
    assert first_fit_pack([4, 3, 2, 5, 1], 6) == [[0, 2], [1, 4], [3]]
    assert first_fit_pack([10, 1], 6) == [[0], [1]]  # an oversized item alone
    assert first_fit_pack([], 6) == []


@pytest.mark.parametrize("seed", range(20))
def test_first_fit_pack_against_a_plain_first_fit(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 15))]
    cap = rng.randint(12, 24)  # every item fits (an oversized one is the hand-computed case)
    bins = first_fit_pack(lengths, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= cap for b in bins)
    where = {i: n for n, b in enumerate(bins) for i in b}
    for i, length in enumerate(lengths):  # no earlier bin had room when item i was placed
        for n in range(where[i]):
            before = sum(lengths[j] for j in bins[n] if j < i)
            assert before + length > cap


def test_expand_bins_by_splitting_hand_computed():
    # only bin 0 (14 tokens) can split: 5->h0, 4->h1, 3->h1 (4<5), 2->h0 (5<7)
    lengths = [5, 4, 3, 2, 10]
    bins = [[0, 1, 2, 3], [4]]
    assert expand_bins_by_splitting(bins, 3, lengths) is None
    assert bins == [[0, 3], [4], [1, 2]]
    expand_bins_by_splitting(bins, 10, lengths)  # stops once every bin is a single item
    assert sorted(map(sorted, bins)) == [[0], [1], [2], [3], [4]]


@pytest.mark.parametrize("seed", range(10))
def test_splitting_never_makes_a_bin_larger(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 50) for _ in range(12)]
    bins = first_fit_pack(lengths, 120)
    largest = max(sum(lengths[i] for i in b) for b in bins)
    expand_bins_by_splitting(bins, len(bins) + 4, lengths)
    assert sorted(i for b in bins for i in b) == list(range(12))
    assert max(sum(lengths[i] for i in b) for b in bins) <= largest


def test_get_reverse_idx_inverts_a_permutation_and_leaves_it_alone():
    perm = [2, 0, 3, 1]
    assert get_reverse_idx(perm) == [1, 3, 0, 2]
    assert perm == [2, 0, 3, 1]
    p = list(range(9))
    random.Random(3).shuffle(p)
    inv = get_reverse_idx(p)
    assert all(inv[p[i]] == i for i in range(9))
    t = torch.tensor([1, 2, 0])
    assert get_reverse_idx(t).tolist() == [2, 0, 1]


# ============================================================== slime.utils.misc

from slime.utils import misc  # noqa: E402


def test_exec_command_echoes_captures_and_raises(capfd):
    assert misc.exec_command("echo hi; echo err >&2", capture_output=True) == "hi\n"
    out = capfd.readouterr().out
    assert "EXEC: echo hi; echo err >&2" in out and "stderr=err" in out
    assert misc.exec_command("true") is None
    with pytest.raises(subprocess.CalledProcessError):
        misc.exec_command("echo boom >&2; exit 3", capture_output=True)
    assert "boom" in capfd.readouterr().out  # the failing command's output is shown


def test_get_free_port_skips_a_busy_port():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        for consecutive in (1, 3):
            got = misc.get_free_port(port, consecutive)
            assert got > port
            from slime.utils.http_utils import is_port_available

            assert all(is_port_available(got + i) for i in range(consecutive))
            # the lowest such start: every start in between has a busy port in its window
            for start in range(max(port, got - 64), got):
                assert not all(is_port_available(start + i) for i in range(consecutive))


def test_get_current_node_ip_without_ray_is_the_host_address(monkeypatch):
    import ray

    if ray.is_initialized():  # pragma: no cover - another test left Ray up
        pytest.skip("Ray is running in this process")
    monkeypatch.delenv("SLIME_HOST_IP", raising=False)
    monkeypatch.delenv("SLIME_PREFER_IPV6", raising=False)
    assert misc.get_current_node_ip() == "127.0.0.1"
    monkeypatch.setenv("SLIME_HOST_IP", "[fd00::7]")
    assert misc.get_current_node_ip() == "fd00::7"  # brackets stripped, as slime does


def test_chunk_named_params_by_size():
    def param(name, floats):
        return (name, torch.zeros(floats, dtype=torch.float32))  # 4 bytes each

    a, b, c = param("a", 10), param("b", 10), param("c", 10)
    chunks = misc.chunk_named_params_by_size([a, b, c], 100)
    assert isinstance(chunks, types.GeneratorType)
    assert [[n for n, _ in ch] for ch in chunks] == [["a", "b"], ["c"]]  # 80 < 100; 120 would not be
    # reaching the size exactly starts a new chunk (>=); a large tensor goes alone
    d, e = param("d", 15), param("e", 100)
    assert [[n for n, _ in ch] for ch in misc.chunk_named_params_by_size([a, d, e, a], 100)] == [
        ["a"],
        ["d"],
        ["e"],
        ["a"],
    ]
    assert list(misc.chunk_named_params_by_size([], 100)) == []


# ============================================================== slime.utils.http_utils

from slime.utils import http_utils  # noqa: E402


def test_find_available_port_steps_as_slime_does(monkeypatch):
    monkeypatch.setattr(random, "randint", lambda lo, hi: 100)
    busy = {1100, 1142}
    monkeypatch.setattr(http_utils, "is_port_available", lambda p: p not in busy)
    assert http_utils.find_available_port(1000) == 1184  # 1100 -> 1142 -> 1184
    busy = {60050, 60007}
    assert http_utils.find_available_port(59950) == 59964  # 60050 -> 60007 -> 59964 (down past 60000)


def test_find_available_port_for_real():
    port = http_utils.find_available_port(20000)
    assert 20100 <= port < 65536 and http_utils.is_port_available(port)


def test_get_host_info_is_loopback_unless_overridden(monkeypatch):
    monkeypatch.delenv("SLIME_HOST_IP", raising=False)
    monkeypatch.delenv("SLIME_PREFER_IPV6", raising=False)
    assert http_utils.get_host_info() == (socket.gethostname(), "127.0.0.1")
    monkeypatch.setenv("SLIME_PREFER_IPV6", "true")
    assert http_utils.get_host_info()[1] == "::1"
    monkeypatch.setenv("SLIME_HOST_IP", "10.1.2.3")
    assert http_utils.get_host_info() == (socket.gethostname(), "10.1.2.3")


def _ignore_sigterm_and_wait(ready):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def test_terminate_process_terms_then_kills():
    ctx = multiprocessing.get_context("fork")
    polite = ctx.Process(target=time.sleep, args=(60,))
    polite.start()
    http_utils.terminate_process(polite, timeout=10)
    assert not polite.is_alive() and polite.exitcode == -signal.SIGTERM

    ready = ctx.Event()
    stubborn = ctx.Process(target=_ignore_sigterm_and_wait, args=(ready,))
    stubborn.start()
    assert ready.wait(30)
    started = time.monotonic()
    http_utils.terminate_process(stubborn, timeout=0.3)
    assert not stubborn.is_alive() and stubborn.exitcode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    http_utils.terminate_process(stubborn)  # already gone: nothing to do


def test_run_router_calls_sglang_routers_launcher_or_says_it_is_missing(monkeypatch):
    calls = []
    launcher = types.ModuleType("sglang_router.launch_router")
    package = types.ModuleType("sglang_router")
    monkeypatch.setitem(sys.modules, "sglang_router", package)
    monkeypatch.setitem(sys.modules, "sglang_router.launch_router", launcher)

    launcher.launch_router = lambda args: calls.append(args) or object()
    assert http_utils.run_router("ARGS") == 0 and calls == ["ARGS"]
    launcher.launch_router = lambda args: None
    assert http_utils.run_router("ARGS") == 1

    def fails(args):
        raise RuntimeError("port in use")

    launcher.launch_router = fails
    assert http_utils.run_router("ARGS") == 1

    monkeypatch.setitem(sys.modules, "sglang_router.launch_router", None)  # not installed
    with pytest.raises(SlimeError, match="sglang-router"):
        http_utils.run_router("ARGS")


def test_init_http_client_caps_open_connections(monkeypatch):
    from aiohttp import web

    monkeypatch.setitem(http_utils._limits, "max_connections", 0)
    http_utils.init_http_client(SimpleNamespace(num_engines=0, sglang_server_concurrency=1))
    assert http_utils._limits["max_connections"] == 0  # no engines: nothing changes
    http_utils.init_http_client(SimpleNamespace(num_engines=2, sglang_server_concurrency=1))
    assert http_utils._limits["max_connections"] == 2  # concurrency x engines

    async def scenario():
        live = peak = 0

        async def handler(request):
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.2)
            live -= 1
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/x", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            out = await asyncio.gather(*(http_utils.post(f"http://127.0.0.1:{port}/x", {}) for _ in range(6)))
        finally:
            await http_utils.close_sessions()
            await runner.cleanup()
        return out, peak

    out, peak = asyncio.run(scenario())
    assert out == [{"ok": True}] * 6
    assert peak == 2
    http_utils.configure(max_connections=0)  # the unlimited default for the tests that follow


# ============================================================== slime.utils.eval_config

from slime.utils.eval_config import (  # noqa: E402
    EvalDatasetConfig,
    build_eval_dataset_configs,
    ensure_dataset_list,
    load_eval_config,
    pick_from_args,
)


def test_pick_from_args_takes_the_first_set_attribute():
    args = SimpleNamespace(eval_temperature=None, rollout_temperature=0.7)
    assert pick_from_args(args, ("eval_temperature", "rollout_temperature")) == 0.7
    assert pick_from_args(args, ("missing", "eval_temperature")) is None
    assert pick_from_args(SimpleNamespace(a=0, b=1), ("a", "b")) == 0  # 0 is set; only None is not
    assert pick_from_args(args, ()) is None


def test_ensure_dataset_list():
    assert ensure_dataset_list(None) == []
    assert ensure_dataset_list({"aime": {"path": "a"}, "gsm": None}) == [
        {"name": "aime", "path": "a"},
        {"name": "gsm"},
    ]
    assert ensure_dataset_list({"x": {"name": "own", "path": "p"}}) == [{"name": "own", "path": "p"}]
    assert ensure_dataset_list(({"name": "a", "path": "p"},)) == [{"name": "a", "path": "p"}]
    with pytest.raises(ValueError, match="name"):
        ensure_dataset_list([{"path": "p"}])
    with pytest.raises(TypeError):
        ensure_dataset_list("aime")


_EVAL_ARGS = dict(
    n_samples_per_eval_prompt=None,
    n_samples_per_prompt=4,
    eval_temperature=0.6,
    rollout_temperature=1.0,
    eval_top_p=None,
    rollout_top_p=0.9,
    eval_input_key=None,
    input_key="prompt",
    label_key="label",
    rollout_max_response_len=128,
    custom_rm_path="m.rm",
)


def test_build_eval_dataset_configs_resolves_entry_then_defaults_then_args():
    args = SimpleNamespace(**_EVAL_ARGS)
    raw = ensure_dataset_list(
        {"aime": {"path": "a.jsonl", "temperature": 0.0, "rm_type": "math"}, "gsm": {"path": "g"}}
    )
    defaults = {"max_response_len": 64, "rm_type": "deepscaler", "metadata_overrides": {"x": 1}}
    aime, gsm = build_eval_dataset_configs(args, raw, defaults)
    assert isinstance(aime, EvalDatasetConfig)
    assert (aime.name, aime.path, aime.temperature, aime.rm_type) == ("aime", "a.jsonl", 0.0, "math")  # entry
    assert (gsm.temperature, gsm.rm_type) == (0.6, "deepscaler")  # eval option; eval.defaults
    assert aime.max_response_len == gsm.max_response_len == 64  # eval.defaults over the args
    assert (gsm.n_samples_per_eval_prompt, gsm.top_p, gsm.input_key, gsm.custom_rm_path) == (4, 0.9, "prompt", "m.rm")
    assert gsm.top_k is None and gsm.metadata_overrides == {"x": 1}
    assert gsm.cache_key == ("gsm", "g", "prompt", "label", None, None)
    assert gsm.inject_metadata({"a": 2}) == {"a": 2, "rm_type": "deepscaler", "x": 1}


def test_build_eval_dataset_configs_refuses_as_slime_does():
    args = SimpleNamespace(**_EVAL_ARGS)
    with pytest.raises(ValueError, match="bogus"):
        build_eval_dataset_configs(args, [{"name": "a", "path": "p"}], {"bogus": 1})
    with pytest.raises(TypeError, match="bogus"):
        build_eval_dataset_configs(args, [{"name": "a", "path": "p", "bogus": 1}], {})
    with pytest.raises(TypeError, match="path"):
        build_eval_dataset_configs(args, [{"name": "a"}], {})
    with pytest.raises(ValueError, match="min_eval_samples"):
        build_eval_dataset_configs(args, [{"name": "a", "path": "p", "min_eval_samples": 0}], {})
    with pytest.raises(TypeError, match="metadata_overrides"):
        build_eval_dataset_configs(args, [{"name": "a", "path": "p", "metadata_overrides": [1]}], {})
    assert build_eval_dataset_configs(args, [], None) == []


def test_build_eval_dataset_configs_agrees_with_the_yaml_loader(tmp_path):
    args = SimpleNamespace(**_EVAL_ARGS)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "eval:\n  defaults:\n    top_k: 20\n    rm_type: math\n"
        "  datasets:\n    - name: aime\n      path: a.jsonl\n      temperature: 0.0\n"
        "    - name: gsm\n      path: g.jsonl\n      rm_type: gsm8k\n"
    )
    entries = [
        {"name": "aime", "path": "a.jsonl", "temperature": 0.0},
        {"name": "gsm", "path": "g.jsonl", "rm_type": "gsm8k"},
    ]
    built = build_eval_dataset_configs(args, entries, {"top_k": 20, "rm_type": "math"})
    loaded = load_eval_config(str(cfg), args)
    assert built == loaded
    assert [c.given for c in built] == [c.given for c in loaded]


# ============================================================== slime.rollout.rm_hub.math_utils

from slime.rollout.rm_hub import math_utils  # noqa: E402


def test_count_unknown_letters_and_should_allow_eval():
    assert math_utils.count_unknown_letters_in_expr("sqrt(x)+frac{y}{z}") == 3  # x, y, z
    assert math_utils.count_unknown_letters_in_expr("2*x + x^2") == 1
    assert math_utils.count_unknown_letters_in_expr("12") == 0
    assert math_utils.should_allow_eval("a+b")
    assert not math_utils.should_allow_eval("a+b+c")  # three unknowns
    assert not math_utils.should_allow_eval("x^{2}") and not math_utils.should_allow_eval("x^(2)")
    assert not math_utils.should_allow_eval("x^22") and not math_utils.should_allow_eval("2^3^4")
    assert math_utils.should_allow_eval("x^2+sqrt(3)")


def test_split_tuple():
    assert math_utils.split_tuple("(1,2]") == ["1", "2"]
    assert math_utils.split_tuple("[1, 2,3]") == ["1", "2", "3"]
    assert math_utils.split_tuple("1,000") == ["1000"]  # a thousands separator, not a tuple
    assert math_utils.split_tuple("(1,000,2)") == ["1000", "2"]
    assert math_utils.split_tuple("(1,(2),3)") == ["(1,(2),3)"]  # brackets inside: one element
    assert math_utils.split_tuple("()") == ["()"]  # too short to be a tuple
    assert math_utils.split_tuple("") == []


def test_are_equal_under_sympy():
    assert math_utils.are_equal_under_sympy("x^2-1", "(x-1)(x+1)")  # implicit products are read
    assert math_utils.are_equal_under_sympy("1/2", "0.5")
    assert math_utils.are_equal_under_sympy("sqrt(2)/2", "1/sqrt(2)")
    assert math_utils.are_equal_under_sympy("3", "3")
    assert not math_utils.are_equal_under_sympy("x", "y")
    assert not math_utils.are_equal_under_sympy("007", "7")  # Python refuses the literal 007
    assert not math_utils.are_equal_under_sympy("2^{10}", "1024")  # not allowed to evaluate
    assert not math_utils.are_equal_under_sympy("(1,2)", "3")  # unparsable as a difference: False
    assert not math_utils.are_equal_under_sympy("9**9**9", "1")  # screened, never evaluated
