"""Where each process of a run lives (`Placement`, `ProcessPlace`) and the thread budget when no
placement says otherwise: the data the fleet's modules share. `slime.ray.placement_group` makes
placements (Ray start-up, bundles, cores) and re-exports these, so slime's builders can live there
without an import circle (the rollout manager and trainer group import this module, not that one).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field

from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.runtime.core_lending import Lender
from slime.runtime.cores import format_cores
from slime.runtime.threads import available_cores


@dataclass
class ProcessPlace:
    """Where one process runs: its node, the cores it is pinned to (None: it shares the node's
    cores unpinned, because the node has fewer cores than processes) and its thread count."""

    role: str  # "trainer rank 0", "engine 1"
    node_id: str
    node_ip: str
    cores: tuple[int, ...] | None
    node_cores: tuple[int, ...]
    threads: int
    lenders: list[Lender] = field(default_factory=list)  # a trainer rank: engines whose idle cores it borrows
    lend_file: str | None = None  # an engine: the file through which it lends its cores while idle

    def describe(self) -> str:
        where = f"node {self.node_ip} ({self.node_id[:8]})"
        if self.cores is None:
            return (
                f"{self.role}: {where}, not pinned (shares cores {format_cores(self.node_cores)} with the "
                f"node's other processes), {self.threads} thread(s)"
            )
        borrows = ""
        if self.lenders:
            lent = format_cores([c for lender in self.lenders for c in lender.cores])
            borrows = f", borrows cores {lent} while their engine is idle"
        return f"{self.role}: {where}, cores {format_cores(self.cores)}, {self.threads} thread(s){borrows}"


@dataclass
class Placement:
    pg: PlacementGroup
    actor_bundles: list[int]  # bundle index of each trainer rank
    engine_bundles: list[int]  # bundle index of each engine (its first slot)
    # Fractions of a bundle's logical CPU: colocated actors must fit together in one bundle.
    actor_cpus: float
    engine_cpus: float
    actors: list[ProcessPlace] = field(default_factory=list)  # per trainer rank
    engines: list[ProcessPlace] = field(default_factory=list)  # per engine

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)

    def summary(self) -> list[str]:
        return [p.describe() for p in [*self.actors, *self.engines]]


def thread_budget(args: Namespace) -> tuple[int, int]:
    """(torch threads per trainer rank, threads per engine) when no placement says otherwise.

    A placement made by `create_placement` overrides both per process (the size of its share of
    its node's cores: `ProcessPlace.threads`); this budget is the fallback: each side may use all
    the cores, divided among its own processes.
    """
    cores = available_cores()
    train = args.train_num_threads or max(1, cores // args.actor_world_size)
    engine = max(1, cores // args.num_engines)
    return train, engine
