"""The training side as a group of Ray actors, called like one object by the loop."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import ray

from slime.backends.torch.actor import RayTrainActor
from slime.errors import SlimeError
from slime.ray.placement_group import Placement, thread_budget
from slime.utils.checkpoint_layout import latest_checkpoint_note
from slime.utils.net import free_port


class RayTrainGroup:
    def __init__(self, args: Namespace, placement: Placement) -> None:
        self.args = args
        train_threads, _ = thread_budget(args)
        world = args.actor_world_size
        master_port = free_port()
        # --train-env-vars: slime's environment for the training processes (Ray merges it with the job's)
        env = {"runtime_env": {"env_vars": dict(args.train_env_vars)}} if args.train_env_vars else {}
        self.actors = [
            RayTrainActor.options(
                num_cpus=placement.actor_cpus, scheduling_strategy=placement.strategy(bundle), **env
            ).remote(args, rank, world, "127.0.0.1", master_port, train_threads)
            for rank, bundle in enumerate(placement.actor_bundles)
        ]
        self.engine_urls: list[str] = []

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
        # Every rank gets the same object ref and takes its own slice of each global batch.
        return self._all("train", rollout_id, data_ref)[0]

    def update_weights(self, weight_version: str) -> float:
        return self._all("update_weights", self.engine_urls, weight_version)[0]

    def check_weight_parity(self, token_ids: list[int]) -> dict[str, float]:
        # Every rank runs the forward pass (a sharded model needs them all); rank 0's answer is kept.
        return {url: self._all("check_weight_parity", url, token_ids)[0] for url in self.engine_urls}

    def save(self, rollout_id: int) -> str:
        return self._all("save", rollout_id)[0]

    def weights_checksum(self) -> float:
        return self._all("weights_checksum")[0]
