"""Ray start-up and placement: which bundle each trainer rank and engine lives in.

On a CPU machine a "GPU" slot is one worker process; bundles hold logical CPUs. Actual
thread counts are set explicitly per process (`slime.utils.threads`), because Ray's CPU
resources are only bookkeeping, and oversubscribed cores were measured to make torch ~30x slower.
"""

from __future__ import annotations

import os
from argparse import Namespace
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.utils.threads import available_cores

WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
    "RAY_AUTH_MODE": "disabled",
}


def init_ray(args: Namespace) -> None:
    """Join `RAY_ADDRESS` if set, else start a local cluster sized for this job."""
    if ray.is_initialized():
        return
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    # Hooks are loaded by dotted path inside actors: give workers the driver's import path.
    pythonpath = os.pathsep.join(dict.fromkeys([os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    runtime_env = {"env_vars": {**WORKER_ENV, "PYTHONPATH": pythonpath}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env, log_to_driver=True)
        return
    # Logical CPUs: one per bundle plus headroom; real threads are budgeted separately.
    needed = num_bundles(args) + 1
    ray.init(
        num_cpus=max(available_cores(), needed),
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=True,
        logging_level="WARNING",
        configure_logging=True,
    )


def num_bundles(args: Namespace) -> int:
    if args.colocate:
        return max(args.actor_world_size, args.rollout_num_gpus)
    return args.actor_world_size + args.rollout_num_gpus


@dataclass
class Placement:
    pg: PlacementGroup
    actor_bundles: list[int]  # bundle index of each trainer rank
    engine_bundles: list[int]  # bundle index of each engine (its first slot)
    # Fractions of a bundle's logical CPU: colocated actors must fit together in one bundle.
    actor_cpus: float
    engine_cpus: float

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)


def create_placement(args: Namespace) -> Placement:
    n = num_bundles(args)
    pg = placement_group([{"CPU": 1} for _ in range(n)], strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    actor_bundles = list(range(args.actor_world_size))
    first_engine = 0 if args.colocate else args.actor_world_size
    engine_bundles = [first_engine + i * args.rollout_num_gpus_per_engine for i in range(args.num_engines)]
    share = 0.4 if args.colocate else 0.9
    return Placement(pg, actor_bundles, engine_bundles, actor_cpus=share, engine_cpus=share)


def thread_budget(args: Namespace) -> tuple[int, int]:
    """(torch threads per trainer rank, threads per engine).

    The synchronous loop alternates rollout and training, so trainers and engines take
    turns on the cores: each side may use all of them, divided among its own processes.
    """
    cores = available_cores()
    train = args.train_num_threads or max(1, cores // args.actor_world_size)
    engine = max(1, cores // args.num_engines)
    return train, engine
