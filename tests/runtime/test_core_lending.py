"""Idle engine cores lent to the trainer (slime.runtime.core_lending): the placement's pairing, the
engine's idle/busy byte, and the trainer's check points re-pinning it and changing its threads in
the thread that computes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from slime.arguments import parse_args
from slime.engine.request import Req
from slime.engine.sampling import SamplingParams
from slime.engine.scheduler import Scheduler
from slime.ray.placement import ProcessPlace
from slime.ray.placement_group import plan_core_lending
from slime.runtime.core_lending import IDLE, CoreBorrower, EngineLending, Lender, decoder_layers, lending_file

BASE = ["--rollout-batch-size", "2", "--num-rollout", "1"]
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def _place(role, node, cores):
    return ProcessPlace(role, node, "10.0.0.1", cores, (0, 1, 2, 3), len(cores or (0,)))


def test_each_engine_lends_its_cores_to_one_trainer_rank_on_its_node(tmp_path):
    args = parse_args(BASE + ["--run-dir", str(tmp_path)])
    actors = [
        _place("trainer rank 0", "a", (0,)),
        _place("trainer rank 1", "a", (1,)),
        _place("trainer rank 2", "b", (0,)),
    ]
    engines = [
        _place("engine 0", "a", (2,)),
        _place("engine 1", "a", (3,)),
        _place("engine 2", "a", (4,)),
        _place("engine 3", "c", (0,)),
        _place("engine 4", "a", None),
    ]
    files = plan_core_lending(args, actors, engines)
    assert files == [lending_file(str(tmp_path), e) for e in range(3)] + [None, None]  # other node; unpinned
    assert [e.lend_file for e in engines] == files  # what each engine's actor is handed
    assert [[(lender.path, lender.cores) for lender in a.lenders] for a in actors] == [
        [(files[0], (2,)), (files[2], (4,))],
        [(files[1], (3,))],
        [],
    ]  # the node's ranks in turn
    assert "borrows cores 2,4 while their engine is idle" in actors[0].describe()


@pytest.mark.parametrize("argv", [["--colocate"], ["--no-lend-idle-cores"], ["--rollout-backend", "sglang"]])
def test_nothing_is_lent_colocated_with_sglang_or_when_switched_off(argv, tmp_path, monkeypatch):
    from slime.arguments import engine as engine_args

    monkeypatch.setattr(engine_args, "sglang_installed", lambda: True)
    args = parse_args(BASE + ["--run-dir", str(tmp_path)] + argv)
    actors, engines = [_place("trainer rank 0", "a", (0,))], [_place("engine 0", "a", (1,))]
    assert plan_core_lending(args, actors, engines) == [None]
    assert actors[0].lenders == [] and engines[0].lend_file is None


def test_the_engine_is_idle_only_while_its_queue_is_empty(tmp_path):
    """The scheduler's worker marks the byte: busy while a batch runs, idle once nothing is left."""
    path = str(tmp_path / "engine_0.idle")
    with open(path, "wb") as f:
        f.write(IDLE)  # a stale file from an earlier run: the engine resets it when it starts
    lending = EngineLending(path)
    read = lambda: open(path, "rb").read(1)  # noqa: E731
    assert read() == b"\x00"
    seen: list[bytes] = []

    class Runner:  # a stand-in model: the scheduler's bookkeeping is what is under test
        def new_batch(self):
            seen.append(read())  # a batch is about to run
            raise RuntimeError("no model")

    sch = Scheduler(runner=Runner(), lending=lending)
    sch.start()
    try:
        deadline = time.time() + 5
        while read() != IDLE and time.time() < deadline:
            time.sleep(0.01)
        assert read() == IDLE  # waiting for work
        sch.submit([Req(input_ids=[1, 2], params=SamplingParams(max_new_tokens=2))])
        while not seen and time.time() < deadline:
            time.sleep(0.01)
        assert seen == [b"\x00"]
        while read() != IDLE and time.time() < deadline:
            time.sleep(0.01)
        assert read() == IDLE  # the batch failed and nothing waits: idle again
    finally:
        sch.stop()


def test_check_points_sit_before_each_layer_and_after_its_backward(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lender_file = str(tmp_path / "engine_0.idle")
    engine = EngineLending(lender_file)
    own = tuple(sorted(os.sched_getaffinity(0)))
    borrower = CoreBorrower(own, torch.get_num_threads(), [Lender(lender_file, (9999,))])
    applied: list[tuple[int, ...]] = []
    borrower._apply = applied.append  # recorded, not done: pinning is the next test's, in a process of its own
    assert borrower.install(model) == len(decoder_layers(model)) == model.config.num_hidden_layers
    order: list[str] = []
    original = borrower.check
    borrower.check = lambda: (order.append("check"), original())[1]
    for i, layer in enumerate(decoder_layers(model)):
        layer.register_forward_hook(lambda m, a, o, i=i: order.append(f"forward {i}"))
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(input_ids=ids).logits.sum()
    n = model.config.num_hidden_layers
    assert order == [x for i in range(n) for x in ("check", f"forward {i}")]
    order.clear()
    engine.idle()
    loss.backward()
    assert order == ["check"] * n  # one per layer, once its backward is done
    assert applied == [own + (9999,)] * n  # idle at each backward check (the recorder never switched)
    assert borrower.take_metrics() == {"perf/borrowed_cores_share": 0.5}  # n of the 2n check points
    order.clear()
    with torch.no_grad():  # no graph: checks before each layer only
        model(input_ids=ids)
    assert order == [x for i in range(n) for x in ("check", f"forward {i}")]


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_the_trainer_takes_idle_cores_and_threads_in_its_compute_thread_and_gives_them_back(tmp_path):
    """In a process of its own (it re-pins itself): pinned to core A with one thread, it borrows
    engine core B while the engine is idle: affinity {A, B} and two torch threads, seen from the
    thread that ran the check; busy again, one core and one thread; give_back restores both."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    script = textwrap.dedent(f"""
        import os, torch, threading
        from slime.runtime.cores import pin_to_cores
        from slime.runtime.core_lending import CoreBorrower, EngineLending, Lender
        pin_to_cores([{a}]); torch.set_num_threads(1)
        engine = EngineLending({str(tmp_path / "e.idle")!r})
        b = CoreBorrower(({a},), 1, [Lender(engine.path, ({b},))])
        state = lambda: (sorted(os.sched_getaffinity(0)), torch.get_num_threads())
        out = [state()]
        b.check(); out.append(state())
        engine.idle(); b.check(); out.append(state())
        tids = [int(t) for t in os.listdir('/proc/self/task')]
        out.append(all(sorted(os.sched_getaffinity(t)) == [{a}, {b}] for t in tids))
        engine.busy(); b.check(); out.append(state())
        engine.idle(); b.check(); b.give_back(); out.append(state())
        print(out)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([([a], 1), ([a], 1), ([a, b], 2), True, ([a], 1), ([a], 1)])
