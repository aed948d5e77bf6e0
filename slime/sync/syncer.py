"""The trainer's weight syncer: one object per run, chosen by transport, behind one interface.

Transports (what `transport_for` picks from the arguments and the weights):

* ``disk``: `--update-weight-transport disk`, a full or delta checkpoint the engines reload
  (`slime.sync.disk`);
* ``shm``: colocated on the CPU with the built-in engine, a shared-memory buffer the engines map
  (`slime.sync.shm`);
* ``ipc``: colocated with the weights on a GPU, SGLang's CUDA IPC handles (`slime.sync.ipc`);
* ``collective``: slime's nccl transport, a broadcast over a process group of the trainer and
  the engines (`slime.sync.distributed`); external engines the trainer can reach take it too.

Every syncer takes the full state on rank 0 and returns the sync's metrics; under
`--use-fault-tolerance` it also writes the snapshot a restarted engine loads. Where
`carries_adapters` says so, a sync may move a LoRA adapter alone (`lora`: the control body's
field, see `slime.engine.lora_weights`); the snapshot is then the merged weights the caller passes.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Protocol

import torch

from slime.arguments.engine import WEIGHT_TRANSPORTS
from slime.errors import SlimeError
from slime.sync.disk import DiskWeightSync
from slime.sync.distributed import DistributedWeightSync
from slime.sync.shm import SharedMemoryWeightSync
from slime.sync.tensor import dedupe_tied
from slime.utils.checkpoint_layout import write_weight_snapshot
from slime.utils.misc import load_function


class WeightSyncer(Protocol):
    transport: str

    def sync(
        self,
        engine_urls: list[str],
        state: dict[str, torch.Tensor],
        weight_version: str,
        *,
        lora: dict | None = None,
        snapshot: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Every engine serves `state` as `weight_version` when this returns (with `lora`: `state`
        holds an adapter the engines merge; `snapshot` the merged weights); the sync's metrics."""
        ...

    def reset(self) -> None:
        """An engine was restarted: the next sync sets up anew whatever it keeps per engine."""
        ...

    def close(self) -> None:
        """Release what the syncer holds (buffers, groups)."""
        ...


def transport_for(args: Namespace, state: dict[str, torch.Tensor]) -> str:
    """Which transport a full sync takes: `disk`, `shm` (colocated, CPU, built-in engine: the trainer
    writes into a buffer the engines map), `ipc` (colocated on a GPU: SGLang's handles) or
    `collective` (the gloo/NCCL group; slime's nccl transport)."""
    if args.update_weight_transport not in WEIGHT_TRANSPORTS:
        raise SlimeError(
            f"--update-weight-transport {args.update_weight_transport!r} has no weight syncer "
            f"(choose {' or '.join(WEIGHT_TRANSPORTS)})"
        )
    if args.update_weight_transport == "disk":
        return "disk"
    if args.colocate and args.rollout_external_engine_addrs is None:
        if any(t.is_cuda for t in state.values()):
            return "ipc"
        if args.rollout_backend == "builtin" and SharedMemoryWeightSync.available():
            return "shm"
    return "collective"


def carries_adapters(args: Namespace, transport: str) -> bool:
    """Whether a sync over `transport` can move a LoRA adapter alone for the engines to merge: shared
    memory, the collective, and full disk versions loaded as they are (a delta, or a copy into
    --update-weight-local-checkpoint-dir, patches a whole checkpoint: those take the merged weights)."""
    if transport in ("shm", "collective"):
        return True
    return transport == "disk" and args.update_weight_mode == "full" and not args.update_weight_local_checkpoint_dir


class _Syncer:
    transport = ""

    def __init__(self, args: Namespace) -> None:
        self.args = args

    def sync(
        self,
        engine_urls: list[str],
        state: dict[str, torch.Tensor],
        weight_version: str,
        *,
        lora: dict | None = None,
        snapshot: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        if lora is not None:
            if not carries_adapters(self.args, self.transport):
                raise SlimeError(f"this {self.transport} weight sync moves whole weights, not a LoRA adapter")
            metrics = self.push(engine_urls, state, weight_version, lora=lora)
        else:
            metrics = self.push(engine_urls, state, weight_version)
        if self.args.use_fault_tolerance:  # what an engine restarted later loads (see checkpoint_layout)
            write_weight_snapshot(
                self.args.run_dir, dedupe_tied(state if snapshot is None else snapshot), weight_version
            )
        return metrics

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        """`lora` comes only where `carries_adapters` (`sync` checks)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Nothing kept per engine: each sync names everything it needs."""

    def close(self) -> None:
        pass


class DiskSyncer(_Syncer):
    transport = "disk"

    def __init__(self, args: Namespace) -> None:
        super().__init__(args)
        hook = None
        if args.custom_update_weight_post_write_path:
            fn = load_function(
                args.custom_update_weight_post_write_path, arg_name="--custom-update-weight-post-write-path"
            )

            def hook(version_dir: str, engines: list[str]) -> None:
                fn(args, version_dir, engines)

        self.disk = DiskWeightSync(
            disk_dir=args.update_weight_disk_dir,
            mode=args.update_weight_mode,
            local_dir=args.update_weight_local_checkpoint_dir,
            keep_files=args.update_weight_disk_keep_files,
            encoding=args.update_weight_delta_encoding,
            checksum=args.update_weight_delta_checksum,
            base_checkpoint=args.hf_checkpoint,
            post_write=hook,
        )

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        """Bytes written and deltas refused (each followed by a full version)."""
        return dict(self.disk.push(engine_urls, state, weight_version=weight_version, lora=lora))


class SharedMemorySyncer(_Syncer):
    transport = "shm"

    def __init__(self, args: Namespace) -> None:
        super().__init__(args)
        self.shm = SharedMemoryWeightSync()

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        size = self.shm.push(engine_urls, state, weight_version=weight_version, lora=lora)
        return {"perf/weight_sync_bytes": float(size)}

    def close(self) -> None:
        self.shm.close()


class IpcSyncer(_Syncer):
    transport = "ipc"

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        from slime.sync.ipc import push_weights_ipc  # CUDA IPC: loaded only where the weights are on a GPU

        push_weights_ipc(engine_urls, state, weight_version=weight_version)
        return {}


class CollectiveSyncer(_Syncer):
    transport = "collective"

    def __init__(self, args: Namespace) -> None:
        super().__init__(args)
        self.group = DistributedWeightSync(buffer_size=args.update_weight_buffer_size)

    def push(
        self, engine_urls: list[str], state: dict[str, torch.Tensor], weight_version: str, lora: dict | None = None
    ) -> dict[str, float]:
        # joins the group on first use
        sent = self.group.push(engine_urls, state, weight_version=weight_version, lora=lora)
        return {"perf/weight_sync_bytes": float(sent)}

    def reset(self) -> None:
        """The next sync builds a new group (a restarted engine is in none)."""
        self.group.close()

    def close(self) -> None:
        self.group.close()


SYNCERS: dict[str, type[_Syncer]] = {
    s.transport: s for s in (DiskSyncer, SharedMemorySyncer, IpcSyncer, CollectiveSyncer)
}


def make_syncer(transport: str, args: Namespace) -> WeightSyncer:
    """The syncer of one transport (a `transport_for` answer)."""
    if transport not in SYNCERS:
        raise SlimeError(
            f"weight sync transport {transport!r} is unknown (--update-weight-transport "
            f"{args.update_weight_transport!r}); known: {', '.join(sorted(SYNCERS))}"
        )
    return SYNCERS[transport](args)


def select_syncer(args: Namespace, state: dict[str, torch.Tensor]) -> WeightSyncer:
    """The syncer for this run's transport (`transport_for`)."""
    return make_syncer(transport_for(args, state), args)
