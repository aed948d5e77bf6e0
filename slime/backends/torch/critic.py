"""The PPO critic: the Hugging Face backbone plus a scalar value head, with its own AdamW.

It lives inside each training rank (next to the policy, same data slice, same FSDP sharding) rather
than as a second Ray actor group: on a CPU box a second group would only contend for the same cores,
and sharing the rank keeps one copy of the rollout data and no extra transfer. The value of response
token t is read at position t-1, exactly where the policy's logits for token t are read.
"""

from __future__ import annotations

import math
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from transformers import AutoModel

from slime.algorithms.losses import reduce_loss, value_loss_clipped
from slime.backends.torch import attention
from slime.backends.torch.batching import MicroBatch, build_micro_batch, pack, plan_micro_batches
from slime.backends.torch.optim import build_optimizer
from slime.backends.torch.rollout_batch import RolloutBatch


def value_head(hidden_size: int, seed: int) -> nn.Linear:
    """The value head's first weights, drawn from `seed` alone (every rank and both backends draw the
    same). Small: the first values are ~0, so the first GAE advantages are ~ the rewards."""
    head = nn.Linear(hidden_size, 1)
    with torch.no_grad():
        head.weight.normal_(0.0, 1e-3, generator=torch.Generator().manual_seed(seed))
        head.bias.zero_()
    return head


class ValueModel(nn.Module):
    """``backbone(input) -> hidden [B, L, H]``, ``head(hidden) -> [B, L]`` (float32)."""

    def __init__(self, path: str, seed: int) -> None:
        super().__init__()
        self.backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        self.backbone.config.use_cache = False
        attention.install(self.backbone)
        self.value_head = value_head(self.backbone.config.hidden_size, seed)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
        kw.pop("use_cache", None)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
        return self.value_head(hidden.last_hidden_state).squeeze(-1)


class Critic:
    def __init__(self, args: Namespace, world_size: int, shard) -> None:
        self.args, self.world_size = args, world_size
        self.model = ValueModel(args.critic_load, args.seed)
        self.model.train()
        if world_size > 1:
            for layer in self.model.backbone.layers:
                shard(layer)
            shard(self.model)
        self.optimizer, self.scheduler = build_optimizer(
            self.model.parameters(), args, lr=args.critic_lr, warmup=args.critic_lr_warmup_iters
        )

    def _plan(self, data: Mapping[str, Any], indices: list[int]) -> list[list[int]]:
        a = self.args
        return plan_micro_batches(
            data, indices, a.micro_batch_size, a.max_tokens_per_gpu if a.use_dynamic_batch_size else None
        )

    @torch.no_grad()
    def values(self, data: Mapping[str, Any], indices: list[int]) -> list[torch.Tensor]:
        """Per-sample values of the response tokens (the "old" values of this rollout); `data`: the
        columns micro-batches are built from (`RolloutBatch.sequences`)."""
        self.model.eval()
        out: list[torch.Tensor] = []
        for mb_idx in self._plan(data, indices):
            mb = build_micro_batch(data, mb_idx, self.args.use_dynamic_batch_size)
            v = mb.forward(self.model)[mb.rows, mb.cols]
            out += list(torch.split(v, mb.response_lengths))
        self.model.train()
        return out

    def micro_batches(self, batch: RolloutBatch, positions: list[int]) -> list[MicroBatch]:
        columns = batch.sequences
        return [
            build_micro_batch(columns, idx, self.args.use_dynamic_batch_size) for idx in self._plan(columns, positions)
        ]

    def micro_batch_loss(
        self, batch: RolloutBatch, mb: MicroBatch, reduce_kw: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped value loss of a micro-batch (its share of the step's) and the parts it logs."""
        values = mb.forward(self.model)[mb.rows, mb.cols]
        loss_t, clip_t = value_loss_clipped(
            values, pack(batch.values, mb.indices), pack(batch.returns, mb.indices), self.args.value_clip
        )
        loss = reduce_loss(loss_t, mb.response_lengths, mb.loss_masks, **reduce_kw)
        clipfrac = reduce_loss(clip_t, mb.response_lengths, mb.loss_masks, **reduce_kw)
        return loss, {"train/value_loss": loss, "train/value_clipfrac": clipfrac}

    def train_step(self, batch: RolloutBatch, positions: list[int], reduce_kw: dict[str, Any]) -> dict[str, float]:
        """One optimizer step of the clipped value loss against the batch's returns (samples `positions`)."""
        stats: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self.micro_batches(batch, positions):
            loss, parts = self.micro_batch_loss(batch, mb, reduce_kw)
            loss.backward()
            for k, v in parts.items():
                stats[k] = stats.get(k, 0.0) + float(v.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip_grad)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        stats["train/critic_lr"] = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["train/critic_grad_norm"] = float(grad_norm)
        return stats

    def state(self) -> dict[str, Any]:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model, optim = get_state_dict(self.model, self.optimizer, options=opts)
        return {"model": model, "optimizer": optim, "scheduler": self.scheduler.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if self.world_size > 1:
            dist.barrier()
