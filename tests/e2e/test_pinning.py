"""The placement on one machine's local Ray cluster (the session's shared one), with processes
pinned: a disaggregated run's trainer rank and engine each run on their own share of the cores
(the plan itself, without processes: tests/ray/test_placement.py; on two nodes:
tests/e2e/test_multi_node.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _allowed(pid: int) -> set[int]:
    """The cores every thread of process `pid` may run on."""
    return set().union(*(os.sched_getaffinity(int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir()))


@pytest.mark.timeout(300)
def test_a_local_disaggregated_run_pins_trainer_and_engine_to_disjoint_cores(
    ray_cluster, tiny_model_dir, task_dir, tmp_path
):
    """A local cluster (the session's), 1 trainer rank + 1 engine: each process (every thread of it)
    runs on its own share of the cores, as the start-up summary says."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from slime.ray.placement_group import create_placement
    from slime.ray.rollout import RolloutManager
    from slime.ray.train_group import RayTrainGroup
    from tests.helpers import make_args

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    assert ray.is_initialized() and "RAY_ADDRESS" not in os.environ  # the session's local cluster
    args = make_args(
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--run-dir",
        str(tmp_path),
    )
    placement = create_placement(args)
    group, manager = RayTrainGroup(args, placement), RolloutManager.options(num_cpus=0).remote(args, placement)
    try:
        ray.get(manager.init.remote())
        trainer, engine = placement.actors[0], placement.engines[0]
        half = len(cores) // 2
        assert (trainer.cores, engine.cores) == (tuple(cores[:half]), tuple(cores[half:]))
        assert (trainer.threads, engine.threads) == (half, len(cores) - half)
        assert set(group.places[0]["cores"]) == set(trainer.cores)  # as the trainer process reports it
        assert _allowed(group.places[0]["pid"]) == set(trainer.cores)
        (engine_pid,) = ray.get(manager.engine_pids.remote())
        assert _allowed(engine_pid) == set(engine.cores)  # the server process, all its threads
    finally:  # what the run made, not the shared cluster
        ray.get(manager.dispose.remote(), timeout=60)
        for actor in [*group.actors, manager]:
            ray.kill(actor)
        remove_placement_group(placement.pg)
