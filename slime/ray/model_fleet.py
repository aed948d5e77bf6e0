"""The engines of every model a run serves (`--sglang-config`, `slime.ray.sglang_config`).

* `EngineActor`: placed by Ray in its bundle, it owns one engine server process (the built-in
  engine on CPU) of one model; the process exits if its owner dies (no orphans).
* `plan_models` lays the models' server groups over the placement's engine slots, in the YAML's
  order, as slime does: an engine of a group with `num_gpus_per_engine` k takes k /
  `--rollout-num-gpus-per-engine` consecutive placement units (their cores together); a
  placeholder group keeps its slots free.
* `launch_models` starts every engine at once and returns the policy's engines (the rollout
  manager serves, syncs, offloads and recovers those as it always has) and the frozen models.
* `FrozenModel`: a model whose weights are never updated: its own router (one engine: the engine
  itself), its own watcher. It is never synced or offloaded, and a dead or hung engine of it
  (`--use-fault-tolerance`) comes back with its own checkpoint, never the policy's weights.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from slime.arguments.engine import sort_passthrough
from slime.errors import SlimeError
from slime.ray.engine_launch import BUILTIN_LAUNCH_TIMEOUT_S, SGLANG_LAUNCH_TIMEOUT_S, ModelLaunch, start_engine
from slime.ray.engine_watcher import start_watcher
from slime.ray.placement import Placement, ProcessPlace
from slime.ray.router import RouterProcess, start_router
from slime.ray.sglang_config import SglangConfig, load_sglang_config

logger = logging.getLogger(__name__)


@ray.remote
class EngineActor:
    """Owns one engine server process; Ray decides where it runs."""

    def __init__(
        self,
        args: Namespace,
        rank: int,
        num_threads: int,
        base_gpu_id: int = 0,
        place: ProcessPlace | None = None,
        model: ModelLaunch | None = None,
    ) -> None:
        self.args, self.rank, self.model = args, rank, model
        self.base_gpu_id = base_gpu_id  # the engine's first GPU slot (its bundle), for SGLang
        # the placement's cores, threads and lending file for this engine (without one: the thread budget)
        self.place = place
        self.num_threads = place.threads if place is not None else num_threads
        self.process = None

    def start(self, port: int | None = None) -> str:
        log_path = Path(self.args.run_dir) / "logs" / f"engine_{self.rank}.log"
        self.process = start_engine(
            self.args,
            self.rank,
            num_threads=self.num_threads,
            base_gpu_id=self.base_gpu_id,
            log_path=log_path,
            port=port,
            cores=self.place.cores if self.place is not None else None,
            lend_file=self.place.lend_file if self.place is not None else None,
            model=self.model,
        )
        sglang = self.args.rollout_backend == "sglang"
        self.process.wait_until_healthy(timeout=SGLANG_LAUNCH_TIMEOUT_S if sglang else BUILTIN_LAUNCH_TIMEOUT_S)
        return self.process.url

    def restart(self) -> str:
        """Kill the server (SIGKILL at once: a hung one ignores SIGTERM) and start a new one at the
        same address; its weights are its checkpoint's until the caller loads others."""
        port = self.process.port if self.process is not None else None
        if self.process is not None:
            self.process.stop(grace=0)
            self.process = None
        return self.start(port=port)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@dataclass
class EngineSlot:
    rank: int  # the engine's index over every model (its log file, its sampling seed)
    bundle: int  # its first slot in the placement group
    place: ProcessPlace | None
    launch: ModelLaunch


@dataclass
class ModelPlan:
    name: str
    model_path: str
    updatable: bool
    slots: list[EngineSlot]


def _merged(places: list[ProcessPlace | None]) -> ProcessPlace | None:
    """One engine on several placement units: their cores and threads together (one node)."""
    if len(places) == 1 or places[0] is None:
        return places[0]
    if len({p.node_id for p in places}) > 1:
        raise SlimeError(
            f"an engine's slots landed on different nodes ({sorted({p.node_ip for p in places})}); an engine is "
            "one process on one node: make num_gpus_per_engine fit in one node's CPUs"
        )
    cores = None if any(p.cores is None for p in places) else tuple(c for p in places for c in p.cores)
    return replace(places[0], cores=cores, threads=sum(p.threads for p in places))


def plan_models(args: Namespace, placement: Placement, config: SglangConfig) -> list[ModelPlan]:
    unit = args.rollout_num_gpus_per_engine
    places = placement.engines or [None] * len(placement.engine_bundles)
    units = list(zip(placement.engine_bundles, places, strict=True))
    if sum(m.num_gpus for m in config.models) != len(units) * unit:
        need = sum(m.num_gpus for m in config.models)
        raise SlimeError(f"{config.source}: its models take {need} engine slots; the placement has {len(units) * unit}")
    plans, cursor, rank = [], 0, 0
    for m in config.models:
        slots = []
        for g in m.groups:
            per_engine = g.num_gpus_per_engine // unit
            extra = g.override_args()
            if args.rollout_backend != "sglang":  # SGLang-only overrides: named by the preflight, not passed
                extra = sort_passthrough(extra, "builtin")[0]
            launch = ModelLaunch(m.model_path, tuple(extra), g.num_gpus_per_engine, frozen=not m.update_weights)
            for _ in range(g.num_engines):
                mine = units[cursor : cursor + per_engine]
                slots.append(EngineSlot(rank, mine[0][0], _merged([p for _, p in mine]), launch))
                cursor, rank = cursor + per_engine, rank + 1
            if g.worker_type == "placeholder":
                cursor += g.num_gpus // unit
        plans.append(ModelPlan(m.name, m.model_path, m.update_weights, slots))
    return plans


def _router(args: Namespace, urls: list[str], model_path: str, log_dir: Path, port: int | None) -> RouterProcess:
    return start_router(
        urls,
        policy=args.router_policy,
        model_path=model_path,
        log_dir=log_dir,
        extra_args=args.router_args,
        api_key=args.engine_api_key,
        admin_api_key=args.engine_admin_api_key,
        port=port,
        request_timeout_secs=args.sglang_router_request_timeout_secs,
    )


class FrozenModel:
    """A model of --sglang-config whose weights are never updated, served by its own router."""

    def __init__(self, args: Namespace, plan: ModelPlan, actors: list[Any], urls: list[str]) -> None:
        self.args, self.name, self.model_path = args, plan.name, plan.model_path
        self.actors, self.urls = actors, list(urls)
        self._engine_of = dict(zip(self.urls, actors, strict=True))
        self.log_dir = Path(args.run_dir) / "logs" / f"model_{plan.name}"
        self.router = _router(args, self.urls, self.model_path, self.log_dir, None) if len(self.urls) > 1 else None
        self.watcher = start_watcher(
            args,
            self.router,
            self.urls,
            restart=self._restart_engine,
            restart_router=self._restart_router,
            on_removed=self._engine_removed,
        )

    @property
    def address(self) -> tuple[str, int]:
        """(ip, port) of its router: args.sglang_model_routers[name]."""
        if self.router is not None:
            return self.router.host, self.router.port
        host, port = self.urls[0].removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    @property
    def url(self) -> str:
        return "http://{}:{}".format(*self.address)

    def _restart_engine(self, url: str) -> str:
        """A new server at the same address with the model's own checkpoint (what it always serves)."""
        new_url = ray.get(self._engine_of[url].restart.remote())
        if new_url != url:
            raise SlimeError(f"engine {url} of model {self.name!r} came back at {new_url}")
        return url

    def _restart_router(self) -> RouterProcess:
        old = self.router
        old.stop(grace=0)
        self.router = _router(self.args, self.urls, self.model_path, self.log_dir, old.port)
        return self.router

    def _engine_removed(self, url: str) -> None:
        logger.warning("engine %s of model %r died and was removed from its router (not restarted)", url, self.name)
        self.urls = [u for u in self.urls if u != url]

    def watch(self, on: bool) -> None:
        if self.watcher is not None and self.args.use_fault_tolerance:
            self.watcher.resume() if on else self.watcher.pause()

    def fault_events(self) -> list[dict]:
        if self.watcher is None or not self.args.use_fault_tolerance:
            return []
        return [{**e, "model": self.name} for e in self.watcher.events]

    def pids(self) -> list[int | None]:
        return ray.get([a.pid.remote() for a in self.actors])

    def dispose(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.router is not None:
            self.router.stop()
        ray.get([a.stop.remote() for a in self.actors])


def launch_models(
    args: Namespace, placement: Placement, engine_threads: int
) -> tuple[ModelPlan, list[Any], list[str], list[FrozenModel]]:
    """Start every model's engines at once: (the policy's plan, engine actors and URLs, the
    frozen models, each with its router)."""
    config = load_sglang_config(args)
    plans = plan_models(args, placement, config)
    actors = {
        p.name: [
            EngineActor.options(
                num_cpus=placement.engine_cpus, scheduling_strategy=placement.strategy(s.bundle)
            ).remote(args, s.rank, engine_threads, base_gpu_id=s.bundle, place=s.place, model=s.launch)
            for s in p.slots
        ]
        for p in plans
    }
    started = {name: [a.start.remote() for a in acts] for name, acts in actors.items()}
    urls = {name: ray.get(refs) for name, refs in started.items()}
    policy = next(p for p in plans if p.updatable)
    frozen = [FrozenModel(args, p, actors[p.name], urls[p.name]) for p in plans if p is not policy]
    return policy, actors[policy.name], urls[policy.name], frozen
