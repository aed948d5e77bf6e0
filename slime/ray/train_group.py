"""The training side as a group of Ray actors, called like one object by the loop."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import ray

from slime.backends.megatron_utils.actor import RayMegatronTrainActor
from slime.backends.torch.actor import RayTrainActor
from slime.errors import SlimeError
from slime.ray.placement import Placement, thread_budget
from slime.utils.checkpoint_layout import latest_checkpoint_note
from slime.utils.net import free_port


class RayTrainGroup:
    def __init__(self, args: Namespace, placement: Placement) -> None:
        self.args = args
        train_threads, _ = thread_budget(args)
        world = args.actor_world_size
        master_port = free_port()
        # the placement's cores and threads per rank (a placement made without them: the thread budget)
        places = placement.actors or [None] * len(placement.actor_bundles)
        threads = [p.threads if p else train_threads for p in places]
        master_addr = places[0].node_ip if places and places[0] else "127.0.0.1"  # rank 0's node
        # --train-env-vars: slime's environment for the training processes (Ray merges it with the job's)
        env = {"runtime_env": {"env_vars": dict(args.train_env_vars)}} if args.train_env_vars else {}
        actor_class = RayMegatronTrainActor if args.train_backend == "megatron" else RayTrainActor
        self.actors = [
            actor_class.options(
                num_cpus=placement.actor_cpus, scheduling_strategy=placement.strategy(bundle), **env
            ).remote(args, rank, world, master_addr, master_port, threads[rank])
            for rank, bundle in enumerate(placement.actor_bundles)
        ]
        # each rank binds itself to its cores before anything else runs in it (Ray runs an actor's calls in order)
        self.places = ray.get(
            [
                actor.pin_cores.remote(
                    list(p.cores) if p and p.cores else None, threads[rank], p.lenders if p else None
                )
                for rank, (actor, p) in enumerate(zip(self.actors, places, strict=True))
            ]
        )
        self.engine_urls: list[str] = []
        self._offloaded = False

    def _all(self, method: str, *a: Any) -> list[Any]:
        refs = [getattr(actor, method).remote(*a) for actor in self.actors]
        pending = list(refs)
        # the first rank to fail ends the call (the others may wait in a collective for it): an error
        # as it is, a rank that died as a message naming it and the checkpoint to resume from
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as e:
                rank = refs.index(done[0])
                raise SlimeError(
                    f"trainer rank {rank} of {len(self.actors)} died during {method} ({type(e).__name__}); the run "
                    f"stops (the other ranks' collectives would wait --distributed-timeout-minutes "
                    f"{self.args.distributed_timeout_minutes} for it); {latest_checkpoint_note(self.args.save)}"
                ) from e
        return ray.get(refs)

    def init(self) -> int:
        return self._all("init")[0]

    def connect_rollout(self, engine_urls: list[str]) -> None:
        self.engine_urls = list(engine_urls)

    def reset_weight_sync(self) -> None:
        """An engine was restarted (same address, new process): rebuild the weight-update group."""
        self._all("reset_weight_sync")

    def train(self, rollout_id: int, data_ref: Any) -> dict[str, float]:
        """With --offload-train (slime: each model auto-offloads after train()), the optimizer state
        comes back before the step and leaves again after it, so it is out of memory while the
        engines generate and evaluate."""
        loaded = self.onload()
        # Every rank gets the same object ref and takes its own slice of each global batch.
        metrics = self._all("train", rollout_id, data_ref)[0]
        if self.args.offload_train:
            metrics = {**metrics, **loaded, **self.offload()}
        return metrics

    def offload(self) -> dict[str, float]:
        """Every rank's optimizer state to a file and gradients dropped (--offload-train); rank 0's numbers."""
        out = self._all("offload")[0]
        self._offloaded = True
        return {f"perf/train_{k}": v for k, v in out.items()}

    def onload(self) -> dict[str, float]:
        """The offloaded state back, bit-identical; a no-op when nothing is offloaded."""
        if not self._offloaded:
            return {}
        out = self._all("onload")[0]
        self._offloaded = False
        return {f"perf/train_{k}": v for k, v in out.items()}

    def update_weights(self, weight_version: str) -> dict[str, float]:
        return self._all("update_weights", self.engine_urls, weight_version)[0]

    def check_weight_parity(self, token_ids: list[int]) -> dict[str, float]:
        # Every rank runs the forward pass (a sharded model needs them all); rank 0's answer is kept.
        return {url: self._all("check_weight_parity", url, token_ids)[0] for url in self.engine_urls}

    def save(self, rollout_id: int) -> str:
        offloaded = self._offloaded  # the checkpoint holds the optimizer state: bring it back for the save
        self.onload()
        path = self._all("save", rollout_id)[0]
        if offloaded:
            self.offload()
        return path
