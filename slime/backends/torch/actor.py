"""TrainActor: one training rank holding the Hugging Face policy on torch.

One rank is a plain module; several ranks form a gloo process group and the model is
sharded with FSDP2 `fully_shard`, so scaling out is a configuration change. Each rank
takes its slice of every global batch; gradients are averaged by FSDP (or are local when
there is one rank), so the loss is normalised by the per-rank share of the global batch.
"""

from __future__ import annotations

import logging
import math
import os
import time
from argparse import Namespace
from typing import Any

import ray
import torch
import torch.distributed as dist

from slime.algorithms.advantages import expand_to_tokens
from slime.algorithms.kl import compute_approx_kl
from slime.algorithms.losses import policy_loss_ppo_clip, reduce_loss, sft_loss
from slime.backends.torch.batching import make_micro_batch, pack, response_log_probs
from slime.utils.threads import configure_torch_threads

logger = logging.getLogger(__name__)


class TrainActor:
    def __init__(self, args: Namespace, rank: int, world_size: int, master_addr: str, master_port: int,
                 num_threads: int) -> None:
        self.args, self.rank, self.world_size = args, rank, world_size
        self.master_addr, self.master_port, self.num_threads = master_addr, master_port, num_threads

    # ------------------------------------------------------------------ set-up
    def init(self) -> int:
        """Load policy (and reference), build the optimizer, resume; return the first rollout id."""
        from transformers import AutoModelForCausalLM

        from slime.backends.torch import checkpoint

        configure_torch_threads(self.num_threads)
        torch.manual_seed(self.args.seed + self.rank)
        if self.world_size > 1:
            os.environ.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size)

        self.model = AutoModelForCausalLM.from_pretrained(self.args.hf_checkpoint, dtype=torch.float32)
        self.model.train()
        self.model.config.use_cache = False
        if self.world_size > 1:
            self._shard(self.model)
        self.ref_model = None
        if self.args.use_kl_loss:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.args.ref_load, dtype=torch.float32)
            self.ref_model.eval().requires_grad_(False)

        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.args.lr, betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_eps, weight_decay=self.args.weight_decay,
        )
        self.pad_id = self.model.config.pad_token_id or 0
        start = 0
        if self.args.load:
            start = checkpoint.load(self, self.args.load)
        return start

    def _shard(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)

    def is_rank0(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ training
    def _my_slice(self, start: int, size: int) -> list[int]:
        per_rank = size // self.world_size
        return list(range(start + self.rank * per_rank, start + (self.rank + 1) * per_rank))

    @torch.no_grad()
    def _forward_only(self, data: dict[str, Any], indices: list[int], model: torch.nn.Module) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        mbs = self.args.micro_batch_size
        for i in range(0, len(indices), mbs):
            mb = make_micro_batch(data, indices[i : i + mbs], self.pad_id)
            lp, _ = response_log_probs(model, mb, self.args.rollout_temperature)
            out += list(torch.split(lp, mb.response_lengths))
        return out

    def train(self, rollout_id: int, data: dict[str, Any]) -> dict[str, float]:
        """One rollout's worth of optimizer steps. Returns rank-averaged metrics."""
        args = self.args
        t0 = time.perf_counter()
        n = len(data["tokens"])
        mine = [i for s in range(0, n, args.global_batch_size) for i in self._my_slice(s, args.global_batch_size)]
        extra: dict[str, float] = {}

        if args.loss_type == "policy_loss":
            # Old policy = the weights that generated (recomputed here, or the engine's own log-probs).
            old = {}
            if args.use_rollout_logprobs:
                old = {i: torch.as_tensor(data["rollout_log_probs"][i]) for i in mine}
            else:
                was_training = self.model.training
                self.model.eval()
                old = dict(zip(mine, self._forward_only(data, mine, self.model)))
                self.model.train(was_training)
            data["old_log_probs"] = old
            if self.ref_model is not None:
                data["ref_log_probs"] = dict(zip(mine, self._forward_only(data, mine, self.ref_model)))
            adv = expand_to_tokens(torch.as_tensor(data["rewards"], dtype=torch.float32), data["response_lengths"])
            data["advantages"] = {i: adv[i] for i in mine}
            if "rollout_log_probs" in data:
                diffs = [(old[i] - torch.as_tensor(data["rollout_log_probs"][i])).abs() for i in mine]
                masks = [torch.as_tensor(data["loss_masks"][i], dtype=torch.bool) for i in mine]
                tot = sum(float(d[m].sum()) for d, m in zip(diffs, masks))
                cnt = sum(int(m.sum()) for m in masks)
                extra["train/train_rollout_logprob_abs_diff"] = tot / max(cnt, 1)

        sums: dict[str, float] = {}
        per_rank_gbs = args.global_batch_size // self.world_size
        for step_start in range(0, len(mine), per_rank_gbs):
            step_indices = mine[step_start : step_start + per_rank_gbs]
            for k, v in self._optimizer_step(data, step_indices).items():
                sums[k] = sums.get(k, 0.0) + v
        steps = max(1, len(mine) // per_rank_gbs)
        metrics = {k: v / steps for k, v in sums.items()}
        metrics.update(extra)
        metrics = self._all_reduce_mean(metrics)
        metrics["train/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["perf/train_time"] = time.perf_counter() - t0
        for key in ("old_log_probs", "ref_log_probs", "advantages"):
            data.pop(key, None)
        return metrics

    def _optimizer_step(self, data: dict[str, Any], indices: list[int]) -> dict[str, float]:
        args = self.args
        num_tokens = float(sum(sum(data["loss_masks"][i]) for i in indices))
        if args.calculate_per_token_loss and self.world_size > 1:
            t = torch.tensor([num_tokens])
            dist.all_reduce(t)
            num_tokens = float(t) / self.world_size  # FSDP averages grads over ranks
        reduce_kw = dict(calculate_per_token_loss=args.calculate_per_token_loss,
                         num_samples=len(indices), num_tokens=max(num_tokens, 1.0))
        stats: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(0, len(indices), args.micro_batch_size):
            mb = make_micro_batch(data, indices[i : i + args.micro_batch_size], self.pad_id)
            masks = mb.loss_masks
            log_probs, entropy = response_log_probs(self.model, mb, args.rollout_temperature, with_entropy=True)

            def red(x: torch.Tensor) -> torch.Tensor:
                return reduce_loss(x, mb.response_lengths, masks, **reduce_kw)

            if args.loss_type == "sft_loss":
                loss = sft_loss(log_probs, mb.response_lengths, masks, **reduce_kw)
                parts = {"train/loss": loss}
            else:
                old = pack(data["old_log_probs"], mb.indices)
                adv = pack(data["advantages"], mb.indices)
                pg, clipfrac, ppo_kl = policy_loss_ppo_clip(log_probs, old, adv, args.eps_clip, args.eps_clip_high)
                pg_loss, entropy_loss = red(pg), red(entropy)
                loss = pg_loss - args.entropy_coef * entropy_loss
                parts = {"train/pg_loss": pg_loss, "train/pg_clipfrac": red(clipfrac), "train/ppo_kl": red(ppo_kl),
                         "train/entropy_loss": entropy_loss}
                if self.ref_model is not None:
                    ref = pack(data["ref_log_probs"], mb.indices)
                    kl_loss = red(compute_approx_kl(log_probs, ref, args.kl_loss_type))
                    loss = loss + args.kl_loss_coef * kl_loss
                    parts["train/kl_loss"] = kl_loss
                parts["train/loss"] = loss
            loss.backward()
            for k, v in parts.items():  # each part is already this micro-batch's share of the step
                stats[k] = stats.get(k, 0.0) + float(v.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip_grad)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm (%s): optimizer step skipped", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        stats["train/grad_norm"] = grad_norm
        return stats

    def _all_reduce_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return metrics
        keys = sorted(metrics)
        t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return {k: float(v) / self.world_size for k, v in zip(keys, t)}

    # ------------------------------------------------------------------ weights
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full, unsharded weights (a collective when sharded; every rank must call)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.world_size == 1:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def update_weights(self, engine_urls: list[str], weight_version: str) -> float:
        """Push the current weights into every engine (rank 0 sends; all ranks gather)."""
        from slime.sync.tensor import push_weights

        t0 = time.perf_counter()
        state = self.full_state_dict()
        if self.is_rank0():
            push_weights(engine_urls, state, weight_version=weight_version)
        return time.perf_counter() - t0

    def check_weight_parity(self, engine_url: str, token_ids: list[int]) -> float:
        """Mean |engine - trainer| log-prob of a fixed sequence (call right after a sync)."""
        from slime.sync.tensor import engine_sequence_log_probs

        engine_lp = torch.as_tensor(engine_sequence_log_probs(engine_url, token_ids))
        self.model.eval()
        with torch.no_grad():
            data = {"tokens": [token_ids], "response_lengths": [len(token_ids) - 1],
                    "loss_masks": [[1] * (len(token_ids) - 1)]}
            mb = make_micro_batch(data, [0], self.pad_id)
            mine, _ = response_log_probs(self.model, mb, 1.0)
        self.model.train()
        return float((mine - engine_lp).abs().mean())

    def save(self, rollout_id: int) -> str:
        from slime.backends.torch import checkpoint

        return checkpoint.save(self, rollout_id)

    def weights_checksum(self) -> float:
        """Sum of |w| over all parameters (tests use it to see that training changed the weights)."""
        return float(sum(v.double().abs().sum() for v in self.full_state_dict().values()))


RayTrainActor = ray.remote(TrainActor)
