"""What one weight sync sends: the policy's full weights, or, for a LoRA policy, its adapter alone.

A LoRA policy sends only its adapter's A and B (and the scaling) when the transport can carry an
adapter (shared memory, the collective, full disk versions: `carries_adapters`) and every engine understands adapter updates (slime's built-in
engine: its `/server_info` has `lora_base_id`): the engines merge it into the base weights they
keep (`slime.engine.lora_weights`, with the trainer's own merge, so the result is the same bits).
The base goes along, once, to every engine that does not hold this trainer's yet: its first sync,
an engine restarted by fault tolerance (it comes back with the merged snapshot and no base), a
resumed trainer. Everything else (disk deltas and local checkpoints, CUDA IPC, SGLang engines) gets the merged
weights W0 + (alpha/r)·B·A, as a full fine-tune's. Under `--use-fault-tolerance` the snapshot a
restarted engine loads is always the merged weights.
"""

from __future__ import annotations

import logging
import uuid
from argparse import Namespace
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from slime.backends.torch import lora, models
from slime.engine.client import client_for
from slime.sync.syncer import WeightSyncer, carries_adapters, transport_for

logger = logging.getLogger(__name__)

MERGED, ADAPTER, ADAPTER_AND_BASE = "merged", "adapter", "adapter+base"


class TrainRank(Protocol):
    """What a payload reads of a training rank (the TrainActor)."""

    args: Namespace
    model: torch.nn.Module
    world_size: int
    syncer: WeightSyncer | None
    adapter_sync: AdapterSync | None

    def is_rank0(self) -> bool: ...

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...


@dataclass
class SyncPayload:
    state: dict[str, torch.Tensor]  # what the transport moves
    lora: dict | None = None  # the update's `lora` field: `state` is an adapter (and maybe the base)
    snapshot: dict[str, torch.Tensor] | None = None  # the merged weights, for the fault-tolerance snapshot

    def metrics(self) -> dict[str, float]:
        if self.lora is None:
            return {}
        return {"perf/weight_sync_lora_base": float(self.lora["base"])}


class AdapterSync:
    """A LoRA policy's side of adapter-only syncs: its base's id (new in every trainer process) and
    how each sync goes."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.base_id = uuid.uuid4().hex
        self.scaling = lora.scaling(model)
        self.modules = lora.adapted_modules(model)
        self._said: str | None = None

    def mode(self, actor: TrainRank, engine_urls: list[str]) -> str:
        """Rank 0: `merged`, `adapter` or `adapter+base` for this sync (asks every engine what it holds)."""
        transport = actor.syncer.transport if actor.syncer is not None else transport_for(actor.args, _params(actor))
        if not carries_adapters(actor.args, transport):
            return self._say(MERGED, f"this {transport} transport moves whole weights")
        held = [client_for(url).get_server_info().get("lora_base_id", False) for url in engine_urls]
        if False in held:
            return self._say(MERGED, "an engine is not slime's built-in engine (no adapter updates)")
        return ADAPTER if all(h == self.base_id for h in held) else ADAPTER_AND_BASE

    def _say(self, mode: str, why: str) -> str:
        if self._said != why:
            logger.info("LoRA weight sync: the merged weights (%s)", why)
            self._said = why
        return mode

    def field(self, with_base: bool) -> dict:
        return {"scaling": self.scaling, "base_id": self.base_id, "base": with_base, "modules": self.modules}


def payload(actor: TrainRank, engine_urls: list[str]) -> SyncPayload:
    """This sync's payload (every rank calls: gathering a sharded model is a collective)."""
    adapter_sync: AdapterSync | None = actor.adapter_sync
    if adapter_sync is None:  # the backend's full weights under transformers' names
        return SyncPayload(actor.full_state_dict())
    mode = adapter_sync.mode(actor, engine_urls) if actor.is_rank0() and engine_urls else MERGED
    if actor.world_size > 1:  # every rank gathers what rank 0 sends
        box = [mode]
        dist.broadcast_object_list(box, src=0)
        mode = box[0]
    if mode == MERGED:
        return SyncPayload(models.full_state(actor.model, actor.world_size))
    snapshot = None
    if mode == ADAPTER_AND_BASE or actor.args.use_fault_tolerance:
        raw = models.full_state(actor.model, actor.world_size, merge=False)
        adapter = lora.engine_adapter(raw)
        if actor.args.use_fault_tolerance:
            snapshot = lora.merged(raw, adapter_sync.scaling)
    else:
        adapter = lora.engine_adapter(lora.gather_adapter(actor.model))
    if mode == ADAPTER_AND_BASE:
        state = {**lora.base_view(raw), **adapter}
    else:
        state = adapter
    return SyncPayload(state, adapter_sync.field(mode == ADAPTER_AND_BASE), snapshot)


def _params(actor: TrainRank) -> dict[str, torch.Tensor]:
    return dict(actor.model.named_parameters())
