"""TrainActor: one training rank holding the Hugging Face policy on torch.

One rank is a plain module; several ranks form a gloo process group and the model is
sharded with FSDP2 `fully_shard`, so scaling out is a configuration change. Each rank
takes its slice of every global batch; gradients are averaged by FSDP (or are local when
there is one rank), so the loss is normalised by the per-rank share of the global batch.

Models a rank may hold besides the policy: the reference (KL loss or KL in the reward), the
old actor (`--keep-old-actor`), the OPD teacher (`--opd-type megatron`) and the PPO critic
(`slime/backends/torch/critic.py`). The RL math is in `slime/backends/torch/loss.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from argparse import Namespace
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from slime.algorithms.losses import reduce_loss, sft_loss
from slime.backends.torch import checkpoint
from slime.backends.torch.batching import (
    build_micro_batch,
    make_micro_batch,
    pack,
    plan_micro_batches,
    response_log_probs,
)
from slime.backends.torch.critic import Critic
from slime.backends.torch.device import (
    autocast,
    memory_metrics,
    process_group_backend,
    reset_peak_memory,
    select_device,
    to_device,
    to_host,
)
from slime.backends.torch.loss import compute_advantages_and_returns, policy_loss
from slime.backends.torch.offload import TrainOffload
from slime.backends.torch.optim import build_optimizer, reset_adam_state, select_trainable
from slime.engine.client import set_default_timeout as set_engine_timeout
from slime.observability.ci_checks import check_logprob_diff, check_train_step, save_or_check_grad_norm
from slime.observability.debug_data import save_train_data
from slime.observability.profile_utils import TrainProfiler
from slime.observability.sample_log import write_advantages
from slime.runtime.core_lending import CoreBorrower, Lender
from slime.runtime.cores import pin_to_cores
from slime.runtime.threads import configure_torch_threads
from slime.sync.disk import DiskWeightSync
from slime.sync.distributed import DistributedWeightSync
from slime.sync.shm import SharedMemoryWeightSync
from slime.sync.tensor import dedupe_tied, engine_sequence_log_probs
from slime.utils.accelerator import check_bf16
from slime.utils.api_keys import register as register_keys
from slime.utils.checkpoint_layout import write_weight_snapshot
from slime.utils.misc import load_function
from slime.utils.seqlen_balancing import balanced_order

logger = logging.getLogger(__name__)


class TrainActor:
    def __init__(
        self,
        args: Namespace,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        num_threads: int,
        device: str | None = None,
    ) -> None:
        self.args, self.rank, self.world_size = args, rank, world_size
        self.master_addr, self.master_port, self.num_threads = master_addr, master_port, num_threads
        self.requested_device = device  # None: CUDA (one GPU per rank) when torch sees one, else the CPU
        self._dist_sync: DistributedWeightSync | None = None  # --update-weight-transport nccl, built on first use
        self._shm: SharedMemoryWeightSync | None = None  # nccl transport, colocated on the CPU
        self._disk: DiskWeightSync | None = None  # --update-weight-transport disk
        self.own_cores: tuple[int, ...] = ()  # the placement's share (pin_cores)
        self.lenders: list[Lender] = []  # engines whose cores this rank may borrow while they idle
        self.borrower: CoreBorrower | None = None

    # ------------------------------------------------------------------ set-up
    def init(self) -> int:
        """Load policy (and reference), build the optimizer, resume; return the first rollout id."""
        configure_torch_threads(self.num_threads)
        torch.manual_seed(self.args.seed + self.rank)
        random.seed(self.args.seed + self.rank)
        if self.args.deterministic_mode:  # as slime's Megatron initialisation
            torch.use_deterministic_algorithms(True)
        self.prof = TrainProfiler(self.args, self.rank)  # --use-pytorch-profiler
        self.device = select_device(self.rank, self.requested_device)
        if self.args.bf16:  # before any weight is loaded: a device without bf16 stops here
            check_bf16(self.device)
        if self.world_size > 1:
            os.environ.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))
            # a collective waits --distributed-timeout-minutes (slime: 10) for a rank that died, not gloo's 30
            dist.init_process_group(
                process_group_backend(self.device),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(minutes=self.args.distributed_timeout_minutes),
            )
        set_engine_timeout(self.args.engine_control_timeout_secs)

        # the initial policy is --ref-load's weights (= --hf-checkpoint unless given), as slime's
        # training starts from --ref-load when --load holds no checkpoint
        self.model = AutoModelForCausalLM.from_pretrained(self.args.ref_load, dtype=torch.float32)
        if self.device.type != "cpu":  # fp32 master weights on the rank's GPU (before sharding)
            self.model.to(self.device)
        self.model.train()
        self.model.config.use_cache = False
        if self.args.recompute_granularity is not None:  # Megatron's --recompute-*: activations recomputed in backward
            enable_activation_checkpointing(self.model)
        a = self.args
        # --only-train / --freeze-params-name-list: before sharding, so FSDP sees the final requires_grad
        trainable = select_trainable(self.model, a.only_train_params_name_list, a.freeze_params_name_list)
        if self.world_size > 1:
            self._shard(self.model)

        def frozen(path: str) -> torch.nn.Module:
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
            return m.to(self.device) if self.device.type != "cpu" else m

        self.ref_model = frozen(a.ref_load) if (a.use_kl_loss or a.kl_coef != 0.0) else None
        self.teacher_model = frozen(a.opd_teacher_load) if (a.use_opd and a.opd_type == "megatron") else None
        # The weights the engines serve; the policy drifts from them during a rollout's steps.
        self.old_actor = frozen(a.hf_checkpoint) if a.keep_old_actor else None
        self.critic = None
        if a.use_critic:
            self.critic = Critic(a, self.world_size, lambda m: self._shard_module(m))

        if self.world_size > 1:  # fully_shard swapped the parameters for sharded ones
            trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_optimizer(trainable, a, lr=a.lr, warmup=a.lr_warmup_iters)
        self.pad_id = self.model.config.pad_token_id or 0
        start = 0
        if self.args.load:
            start = checkpoint.load(self, self.args.load)
        self._snapshot_old_actor()
        if self.lenders and self.own_cores and self.device.type == "cpu":
            self.borrower = CoreBorrower(self.own_cores, self.num_threads, self.lenders)
            self.borrower.install(self.model)
        self.prof.on_init_end()
        return start

    def _shard_module(self, module: torch.nn.Module) -> None:
        fully_shard(module)

    def _snapshot_old_actor(self) -> None:
        if self.old_actor is not None:
            self.old_actor.load_state_dict(self._full_state_every_rank())

    def _full_state_every_rank(self) -> dict[str, torch.Tensor]:
        """Full weights on every rank (the frozen copies are unsharded on each rank)."""
        if self.world_size == 1:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))

    def _shard(self, model: torch.nn.Module) -> None:
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)

    def is_rank0(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ training
    def _my_slice(self, start: int, size: int) -> list[int]:
        per_rank = size // self.world_size
        return list(range(start + self.rank * per_rank, start + (self.rank + 1) * per_rank))

    def _plan(self, data: dict[str, Any], indices: list[int]) -> list[list[int]]:
        a = self.args
        return plan_micro_batches(
            data, indices, a.micro_batch_size, a.max_tokens_per_gpu if a.use_dynamic_batch_size else None
        )

    def _micro_batch(self, data: dict[str, Any], indices: list[int]):
        a = self.args
        return to_device(
            build_micro_batch(data, indices, a.use_dynamic_batch_size, self.pad_id, a.share_prompt_forward), self.device
        )

    @torch.no_grad()
    def _forward_only(
        self,
        data: dict[str, Any],
        indices: list[int],
        model: torch.nn.Module,
        entropy_out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Per-sample response log-probs; per-sample entropies appended to ``entropy_out`` if given."""
        out: list[torch.Tensor] = []
        was_training = model.training
        model.eval()
        for mb_indices in self._plan(data, indices):
            mb = self._micro_batch(data, mb_indices)
            lp, ent = response_log_probs(
                model,
                mb,
                self.args.rollout_temperature,
                with_entropy=entropy_out is not None,
                chunk_size=self.args.log_probs_chunk_size,
            )
            lp, ent = to_host(lp), to_host(ent)  # per-token values live on the host (no-op on the CPU)
            out += list(torch.split(lp, mb.response_lengths))
            if entropy_out is not None:
                entropy_out += list(torch.split(ent, mb.response_lengths))
        model.train(was_training)
        return out

    def _sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            t = t.clone()
            dist.all_reduce(t)
        return t

    def _prepare_rl_data(self, data: dict[str, Any], mine: list[int], rollout_id: int = 0) -> dict[str, float]:
        """Old / reference / teacher log-probs, critic values, advantages and returns for this rank's samples."""
        args = self.args
        extra: dict[str, float] = {}
        # --use-rollout-entropy: entropies come with the old / reference forward passes (none when
        # the old log-probs are the engine's), as in slime
        entropy: list[torch.Tensor] | None = [] if args.use_rollout_entropy else None
        ref_entropy: list[torch.Tensor] | None = [] if args.use_rollout_entropy else None
        if args.use_rollout_logprobs:
            old = [torch.as_tensor(data["rollout_log_probs"][i], dtype=torch.float32) for i in mine]
            entropy = None
            if args.get_mismatch_metrics:  # slime: one more forward pass for the trainer's own log-probs
                data["mismatch_log_probs"] = dict(zip(mine, self._forward_only(data, mine, self.model)))
        elif self._reuse_training_forward:
            # one optimizer step and nothing reads the old log-probs before it: they are the training
            # forward's own, detached (the policy loss's default), and the values here are never read
            # (only their lengths: no KL in the reward, no OPD, no custom estimator)
            old = [torch.zeros(int(data["response_lengths"][i])) for i in mine]
        else:
            old = self._forward_only(data, mine, self.old_actor if self.old_actor is not None else self.model, entropy)
            data["train_log_probs"] = dict(zip(mine, old))
        if not self._reuse_training_forward:
            data["old_log_probs"] = dict(zip(mine, old))
        if self.ref_model is not None:
            data["ref_log_probs"] = dict(zip(mine, self._forward_only(data, mine, self.ref_model, ref_entropy)))
        else:
            ref_entropy = None
        rollout_data: dict[str, Any] = {
            "log_probs": old,
            "rewards": [data["rewards"][i] for i in mine],
            "loss_masks": [data["loss_masks"][i] for i in mine],
            "response_lengths": [data["response_lengths"][i] for i in mine],
        }
        if entropy is not None:
            rollout_data["entropy"] = entropy
        if ref_entropy is not None:
            rollout_data["ref_entropy"] = ref_entropy
        if self.ref_model is not None:
            rollout_data["ref_log_probs"] = [data["ref_log_probs"][i] for i in mine]
        if "rollout_log_probs" in data:
            rollout_data["rollout_log_probs"] = [torch.as_tensor(data["rollout_log_probs"][i]) for i in mine]
        if self.teacher_model is not None:
            rollout_data["teacher_log_probs"] = self._forward_only(data, mine, self.teacher_model)
        elif "teacher_log_probs" in data:
            rollout_data["teacher_log_probs"] = [data["teacher_log_probs"][i] for i in mine]
        if self.critic is not None:
            rollout_data["values"] = self.critic.values(data, mine)
            data["values"] = dict(zip(mine, rollout_data["values"]))
        compute_advantages_and_returns(args, rollout_data, self._sum_over_ranks)
        self._postprocess(data, mine, rollout_id, rollout_data)
        data["advantages"] = dict(zip(mine, rollout_data["advantages"]))
        write_advantages(args, rollout_id, data, mine, self.rank)  # the report's logged samples, this rank's share
        data["returns"] = dict(zip(mine, rollout_data["returns"]))
        token_mean = self._token_mean(rollout_data["loss_masks"])
        for key in ("entropy", "ref_entropy"):
            if key in rollout_data:
                extra[f"rollout/{key}"] = token_mean(rollout_data[key])

        adv = rollout_data["advantages"]
        mean = token_mean(adv)
        extra["rollout/advantages"] = mean
        extra["rollout/advantages_std"] = max(token_mean([(pack(adv, range(len(adv))) - mean) ** 2]), 0.0) ** 0.5
        extra["rollout/returns"] = token_mean(rollout_data["returns"])
        if self.critic is not None:
            extra["rollout/values"] = token_mean(rollout_data["values"])
        if "opd_reverse_kl" in rollout_data:
            extra["train/opd_reverse_kl"] = token_mean(rollout_data["opd_reverse_kl"])
        if "rollout_log_probs" in data and not self._reuse_training_forward:  # else: after the training forward
            diffs = [(o - r).abs() for o, r in zip(old, rollout_data["rollout_log_probs"])]
            extra["train/train_rollout_logprob_abs_diff"] = token_mean(diffs)
        return extra

    # Issue 16: one forward where one suffices. Tests and bench/train_step.py set it False to force
    # the separate old-log-prob pass and compare.
    reuse_training_forward = True
    _reuse_training_forward = False  # decided per rollout by _train

    def _can_reuse_training_forward(self, num_steps: int, critic_only: bool) -> bool:
        """Whether the old log-probs may be the training forward's own (detached: ratio exactly 1):
        one optimizer step in the rollout, the policy trains, the old policy is the current one, and
        nothing reads the old log-probs before the training forward or besides it."""
        a = self.args
        if not self.reuse_training_forward or num_steps != 1 or critic_only:
            return False
        if a.loss_type != "policy_loss" or a.use_rollout_logprobs or self.old_actor is not None:
            return False
        # --use-tis reads the old log-probs only inside the loss (its weights: old against rollout), where
        # they are the training forward's own: it needs no separate pass either
        needs_old_before = (
            a.use_opsm,
            a.get_mismatch_metrics,
            a.use_rollout_entropy,
            a.kl_coef != 0.0,
            a.use_opd,
            a.custom_advantage_function_path,
            a.rollout_data_postprocess_path,
            a.save_debug_train_data is not None,
        )
        if any(needs_old_before):
            return False
        # dropout: the training forward (train mode) would not be the old policy's (eval mode)
        config = self.model.config.to_dict()
        return not any(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for k, v in config.items()
            if "dropout" in k
        )

    def _reused_forward_metrics(self, data: dict[str, Any], mine: list[int]) -> dict[str, float]:
        """What the separate pass would have reported, from the training forward's log-probs."""
        if "rollout_log_probs" not in data:
            return {}
        token_mean = self._token_mean([data["loss_masks"][i] for i in mine])
        diff = (pack(data["training_forward_log_probs"], mine) - pack(data["rollout_log_probs"], mine)).abs()
        return {"train/train_rollout_logprob_abs_diff": token_mean([diff])}

    def _postprocess(
        self, data: dict[str, Any], mine: list[int], rollout_id: int, rollout_data: dict[str, Any]
    ) -> None:
        """slime's ``--rollout-data-postprocess-path`` (after advantages, before training). Its
        ``loss_masks`` are the ones trained on (a special loss mask, e.g. from ``entropy``); the
        per-sample denominators stay those the rollout delivered (``rollout_mask_sums``), as slime's."""
        if not self.args.rollout_data_postprocess_path:
            return
        load_function(self.args.rollout_data_postprocess_path, arg_name="--rollout-data-postprocess-path")(
            self.args, rollout_id, rollout_data
        )
        data["loss_masks"] = list(data["loss_masks"])
        for i, m in zip(mine, rollout_data["loss_masks"], strict=True):
            data["loss_masks"][i] = m

    def _prepare_without_advantages(self, data: dict[str, Any], mine: list[int], rollout_id: int) -> None:
        """``--loss-type sft_loss`` / ``--disable-compute-advantages-and-returns``: no forward pass, no
        estimator; the postprocess hook still runs and may set ``advantages`` (and ``returns``)."""
        args = self.args
        rollout_data: dict[str, Any] = {
            "rewards": [data["rewards"][i] for i in mine],
            "loss_masks": [data["loss_masks"][i] for i in mine],
            "response_lengths": [data["response_lengths"][i] for i in mine],
        }
        if "rollout_log_probs" in data:
            rollout_data["rollout_log_probs"] = [torch.as_tensor(data["rollout_log_probs"][i]) for i in mine]
            if args.use_rollout_logprobs:
                data["old_log_probs"] = dict(zip(mine, rollout_data["rollout_log_probs"]))
        self._postprocess(data, mine, rollout_id, rollout_data)
        for key in ("advantages", "returns"):
            if key in rollout_data:
                data[key] = dict(zip(mine, rollout_data[key]))

    def _token_mean(self, loss_masks: list[Any]):
        """Mean of per-token values over the trained tokens of every rank (one packed sum, float64)."""
        mask = pack(loss_masks, range(len(loss_masks)), torch.bool)
        count = float(mask.sum())

        def token_mean(xs: list[torch.Tensor]) -> float:
            total = float(pack(xs, range(len(xs)), torch.float64)[mask].sum()) if count else 0.0
            s = self._sum_over_ranks(torch.tensor([total, count], dtype=torch.float64))
            return float(s[0] / max(float(s[1]), 1.0))

        return token_mean

    def train(self, rollout_id: int, data: dict[str, Any]) -> dict[str, float]:
        """One rollout's worth of optimizer steps. Returns rank-averaged metrics."""
        reset_peak_memory(self.device)
        borrowing = self.borrower.borrowing() if self.borrower is not None else contextlib.nullcontext()
        with borrowing, autocast(self.device, self.args.bf16, self.args.fp16):  # Megatron's --bf16 / --fp16
            metrics = self._train(rollout_id, data)
        if self.borrower is not None:
            metrics.update(self.borrower.take_metrics())
        metrics.update(memory_metrics(self.device))  # GPU memory of this rank (nothing on the CPU)
        return metrics

    def _train(self, rollout_id: int, data: dict[str, Any]) -> dict[str, float]:
        args = self.args
        t0 = time.perf_counter()
        n = len(data["tokens"])
        order = list(range(n))
        if args.balance_data and self.world_size > 1 and n % self.world_size == 0:  # even tokens per rank
            order = balanced_order(
                [len(t) for t in data["tokens"]], self.world_size, args.global_batch_size // self.world_size
            )
        mine = [
            order[i] for s in range(0, n, args.global_batch_size) for i in self._my_slice(s, args.global_batch_size)
        ]
        if args.reset_optimizer_states:  # slime: at the start of every rollout's training, critic's too
            reset_adam_state(self.optimizer)
            if self.critic is not None:
                reset_adam_state(self.critic.optimizer)
        own_denoms = "rollout_mask_sums" not in data
        if own_denoms:  # per-sample mean denominators, fixed before any hook edits the masks
            data["rollout_mask_sums"] = [float(sum(m)) for m in data["loss_masks"]]
        extra: dict[str, float] = {}
        critic_only = self.critic is not None and rollout_id < args.num_critic_only_steps
        per_rank_gbs = args.global_batch_size // self.world_size
        self._reuse_training_forward = self._can_reuse_training_forward(
            len(range(0, len(mine), per_rank_gbs)), critic_only
        )
        if args.loss_type != "sft_loss" and args.compute_advantages_and_returns:
            with self.prof.phase("train_log_probs"):
                extra = self._prepare_rl_data(data, mine, rollout_id)
        else:
            self._prepare_without_advantages(data, mine, rollout_id)
        if args.save_debug_train_data is not None:
            self._save_debug_train_data(rollout_id, data, mine)

        sums: dict[str, float] = {}
        with self.prof.phase("train_actor"):
            for step_start in range(0, len(mine), per_rank_gbs):
                step_indices = mine[step_start : step_start + per_rank_gbs]
                reduce_kw = self._reduce_kw(data, step_indices)
                step_metrics: dict[str, float] = {}
                if self.critic is not None:
                    step_metrics.update(self.critic.train_step(data, step_indices, reduce_kw))
                if not critic_only:
                    step_metrics.update(self._optimizer_step(data, step_indices, reduce_kw))
                self._ci_step(rollout_id, step_start // per_rank_gbs, step_metrics)
                for k, v in step_metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
        steps = max(1, len(mine) // per_rank_gbs)
        metrics = {k: v / steps for k, v in sums.items()}
        if self._reuse_training_forward:
            extra.update(self._reused_forward_metrics(data, mine))
        metrics.update(extra)
        metrics = self._all_reduce_mean(metrics)
        check_logprob_diff(args, rollout_id, metrics)  # --ci-test
        if args.ref_update_interval and self.ref_model is not None and (rollout_id + 1) % args.ref_update_interval == 0:
            self.ref_model.load_state_dict(self._full_state_every_rank())
        metrics["perf/train_time"] = time.perf_counter() - t0
        self.prof.step()
        for key in (
            "old_log_probs",
            "train_log_probs",
            "ref_log_probs",
            "advantages",
            "returns",
            "values",
            "mismatch_log_probs",
            "training_forward_log_probs",
            *(("rollout_mask_sums",) if own_denoms else ()),
        ):
            data.pop(key, None)
        return metrics

    def _ci_step(self, rollout_id: int, step_id: int, step_metrics: dict[str, float]) -> None:
        """--ci-test's on-policy checks and --ci-save/load-grad-norm on one optimizer step."""
        check_train_step(self.args, rollout_id, step_id, step_metrics)
        if "train/grad_norm" in step_metrics:
            save_or_check_grad_norm(
                self.args, rollout_id, step_id, step_metrics["train/grad_norm"], writer=self.is_rank0()
            )

    # per-sample columns of --save-debug-train-data: saved name -> column of the train data
    DEBUG_TRAIN_COLUMNS = {
        "tokens": "tokens",
        "response_length": "response_lengths",
        "loss_mask": "loss_masks",
        "reward": "rewards",
        "raw_reward": "raw_reward",
        "log_probs": "old_log_probs",
        "ref_log_probs": "ref_log_probs",
        "rollout_log_probs": "rollout_log_probs",
        "advantages": "advantages",
        "returns": "returns",
        "values": "values",
    }

    def _save_debug_train_data(self, rollout_id: int, data: dict[str, Any], mine: list[int]) -> None:
        """--save-debug-train-data: rank 0 writes every rank's samples with what was computed for them."""

        def plain(v: Any) -> Any:
            return v.tolist() if isinstance(v, torch.Tensor) else v

        local = [
            {
                "sample_index": i,
                "data_parallel_rank": self.rank,
                **{name: plain(data[col][i]) for name, col in self.DEBUG_TRAIN_COLUMNS.items() if col in data},
            }
            for i in mine
        ]
        if self.world_size > 1:
            parts: list[Any] | None = [None] * self.world_size if self.is_rank0() else None
            dist.gather_object(local, parts, dst=0)
            local = [s for part in parts or [] for s in part]
        if self.is_rank0():
            save_train_data(
                self.args.save_debug_train_data,
                rollout_id,
                self.rank,
                local,
                readable=self.args.dump_details is not None,
            )

    def _reduce_kw(self, data: dict[str, Any], indices: list[int]) -> dict[str, Any]:
        """Global-batch denominators of slime's two reductions (same for every micro-batch of the step)."""
        args = self.args
        num_tokens = float(sum(sum(data["loss_masks"][i]) for i in indices))
        # FAILED samples (and groups dropped for too few valid samples) are out of the sample average
        excluded = data.get("excluded")
        num_samples = float(len(indices) - sum(excluded[i] for i in indices)) if excluded else float(len(indices))
        if self.world_size > 1 and (args.calculate_per_token_loss or excluded):
            t = torch.tensor([num_tokens, num_samples])
            dist.all_reduce(t)
            mean_tokens, mean_samples = (float(x) / self.world_size for x in t)  # FSDP averages grads over ranks
            num_tokens = mean_tokens if args.calculate_per_token_loss else num_tokens
            num_samples = mean_samples if excluded else num_samples
        return dict(
            calculate_per_token_loss=args.calculate_per_token_loss,
            num_samples=max(num_samples, 1.0) if excluded else len(indices),
            num_tokens=max(num_tokens, 1.0),
        )

    def _optimizer_step(self, data: dict[str, Any], indices: list[int], reduce_kw: dict[str, Any]) -> dict[str, float]:
        args = self.args
        stats: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for mb_indices in self._plan(data, indices):
            mb = self._micro_batch(data, mb_indices)
            masks = mb.loss_masks
            # the entropy is always logged; it needs a graph only when it is in the loss
            log_probs, entropy = response_log_probs(
                self.model,
                mb,
                args.rollout_temperature,
                with_entropy=True,
                chunk_size=args.log_probs_chunk_size,
                entropy_grad=args.entropy_coef != 0.0,
            )
            log_probs, entropy = to_host(log_probs), to_host(entropy)  # the losses run on the host
            if self._reuse_training_forward:  # the old log-probs of this rollout's single step
                data.setdefault("training_forward_log_probs", {}).update(
                    zip(mb.indices, torch.split(log_probs.detach(), mb.response_lengths))
                )
            denoms = [float(data["rollout_mask_sums"][i]) for i in mb.indices]

            def red(x: torch.Tensor) -> torch.Tensor:
                return reduce_loss(x, mb.response_lengths, masks, sample_denoms=denoms, **reduce_kw)

            if args.loss_type == "sft_loss":
                loss = sft_loss(log_probs, mb.response_lengths, masks, sample_denoms=denoms, **reduce_kw)
                parts = {"train/loss": loss}
            elif args.loss_type == "custom_loss":
                loss, parts = self._custom_loss(data, mb, red)
            else:
                loss, parts = policy_loss(args, data, mb, log_probs, entropy, reduce_kw, denoms)
                parts["train/loss"] = loss
            loss.backward()
            for k, v in parts.items():  # each part is already this micro-batch's share of the step
                stats[k] = stats.get(k, 0.0) + float(v.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip_grad)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        stats["train/lr"] = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm (%s): optimizer step skipped", grad_norm)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["train/grad_norm"] = grad_norm
        return stats

    def _custom_loss(self, data: dict[str, Any], mb, red) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``--custom-loss-function-path``: ``fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``.

        ``logits`` are the response-aligned logits ``[sum R_i, V]`` (row j predicts response token j;
        not divided by the temperature); ``batch`` holds this micro-batch's per-sample lists.
        """
        fn = load_function(self.args.custom_loss_function_path, arg_name="--custom-loss-function-path")
        logits = mb.response_logits(self.model)
        batch = {
            "response_lengths": mb.response_lengths,
            "loss_masks": mb.loss_masks,
            "response_tokens": list(torch.split(mb.targets, mb.response_lengths)),
            **{
                k: [data[k][i] for i in mb.indices]
                for k in ("old_log_probs", "ref_log_probs", "advantages", "returns", "rollout_log_probs", "rewards")
                if k in data
            },
        }
        loss, metrics = fn(self.args, batch, logits, red)
        return loss, {(k if k.startswith("train/") else f"train/{k}"): v for k, v in metrics.items()}

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
        if self.world_size == 1:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def reset_weight_sync(self) -> None:
        """--use-fault-tolerance restarted an engine: the next distributed update builds a new group
        (the shared-memory and disk paths need nothing: each update names everything it needs)."""
        if self._dist_sync is not None:
            self._dist_sync.close()

    def weight_sync_path(self, state: dict[str, torch.Tensor]) -> str:
        """Which path a full sync takes: `disk`, `shm` (colocated, CPU, built-in engine: the trainer
        writes into a buffer the engines map), `ipc` (colocated on a GPU: SGLang's handles) or
        `collective` (the gloo/NCCL group; slime's nccl transport)."""
        a = self.args
        if a.update_weight_transport == "disk":
            return "disk"
        if a.colocate and a.rollout_external_engine_addrs is None:
            if any(t.is_cuda for t in state.values()):
                return "ipc"
            if a.rollout_backend == "builtin" and SharedMemoryWeightSync.available():
                return "shm"
        return "collective"

    def _disk_sync(self) -> DiskWeightSync:
        a = self.args
        hook = None
        if a.custom_update_weight_post_write_path:
            fn = load_function(
                a.custom_update_weight_post_write_path, arg_name="--custom-update-weight-post-write-path"
            )

            def hook(version_dir: str, engines: list[str]) -> None:
                fn(a, version_dir, engines)

        return DiskWeightSync(
            disk_dir=a.update_weight_disk_dir,
            mode=a.update_weight_mode,
            local_dir=a.update_weight_local_checkpoint_dir,
            keep_files=a.update_weight_disk_keep_files,
            encoding=a.update_weight_delta_encoding,
            checksum=a.update_weight_delta_checksum,
            base_checkpoint=a.hf_checkpoint,
            post_write=hook,
        )

    def update_weights(self, engine_urls: list[str], weight_version: str) -> dict[str, float]:
        """Push the current weights into every engine (rank 0 sends; all ranks gather). Returns
        the sync's metrics: perf/update_weights_time, and for disk syncs the bytes written and
        the deltas refused (each followed by a full sync)."""
        t0 = time.perf_counter()
        register_keys(engine_urls, self.args.engine_api_key, self.args.engine_admin_api_key)
        state = self.full_state_dict()
        metrics: dict[str, float] = {}
        if self.is_rank0() and engine_urls:
            path = self.weight_sync_path(state)
            if path == "disk":
                if self._disk is None:
                    self._disk = self._disk_sync()
                metrics.update(self._disk.push(engine_urls, state, weight_version=weight_version))
            elif path == "shm":
                if self._shm is None:
                    self._shm = SharedMemoryWeightSync()
                metrics["perf/weight_sync_bytes"] = float(
                    self._shm.push(engine_urls, state, weight_version=weight_version)
                )
            elif path == "ipc":
                from slime.sync.ipc import push_weights_ipc

                push_weights_ipc(engine_urls, state, weight_version=weight_version)
            else:
                if self._dist_sync is None:
                    self._dist_sync = DistributedWeightSync(buffer_size=self.args.update_weight_buffer_size)
                self._dist_sync.push(engine_urls, state, weight_version=weight_version)
            if self.args.use_fault_tolerance:  # what an engine restarted later loads (see checkpoint_layout)
                write_weight_snapshot(self.args.run_dir, dedupe_tied(state), weight_version)
        self._snapshot_old_actor()  # the engines now serve these weights
        metrics["perf/update_weights_time"] = time.perf_counter() - t0
        return metrics

    def check_weight_parity(self, engine_url: str, token_ids: list[int]) -> float:
        """Mean |engine - trainer| log-prob of a fixed sequence (call right after a sync)."""
        register_keys([engine_url], self.args.engine_api_key, self.args.engine_admin_api_key)
        engine_lp = torch.as_tensor(engine_sequence_log_probs(engine_url, token_ids))
        self.model.eval()
        with torch.no_grad():
            data = {
                "tokens": [token_ids],
                "response_lengths": [len(token_ids) - 1],
                "loss_masks": [[1] * (len(token_ids) - 1)],
            }
            mb = to_device(make_micro_batch(data, [0], self.pad_id), self.device)
            mine = to_host(response_log_probs(self.model, mb, 1.0)[0])
        self.model.train()
        return float((mine - engine_lp).abs().mean())

    def save(self, rollout_id: int) -> str:
        return checkpoint.save(self, rollout_id)

    def weights_checksum(self) -> float:
        """Sum of |w| over all parameters (tests use it to see that training changed the weights)."""
        return float(sum(v.double().abs().sum() for v in self.full_state_dict().values()))

    # ------------------------------------------------------------------ placement, --offload-train
    def pin_cores(
        self, cores: list[int] | None, num_threads: int, lenders: list[Lender] | None = None
    ) -> dict[str, Any]:
        """Bind this rank to its placement's cores (called before `init`, so its threads follow).
        `lenders`: engines on this node whose cores it may borrow while they are idle (CPU only)."""
        self.num_threads = num_threads
        self.own_cores = tuple(cores or ())
        self.lenders = list(lenders or [])
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "cores": list(pin_to_cores(cores)),
            "threads": num_threads,
        }

    def _offload_state(self) -> TrainOffload:
        if "_train_offload" not in self.__dict__:
            self._train_offload = TrainOffload(os.path.join(self.args.run_dir, "offload"))
        return self._train_offload

    def offload(self) -> dict[str, float]:
        """--offload-train: optimizer state (critic's too) to a file, gradients dropped, until `onload`."""
        optimizers = [self.optimizer] + ([self.critic.optimizer] if self.critic is not None else [])
        modules = [self.model] + ([self.critic.model] if self.critic is not None else [])
        return self._offload_state().offload(optimizers, modules)

    def onload(self) -> dict[str, float]:
        """The offloaded optimizer state back in memory, bit-identical (a no-op when not offloaded)."""
        return self._offload_state().onload()


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute every decoder layer's activations in the backward pass (non-reentrant, FSDP2-safe)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


RayTrainActor = ray.remote(TrainActor)
