"""TrainActor: one training rank (the Ray actor the trainer group drives). Its job: the models, the
optimizer steps of a rollout, the checkpoint. Several ranks form a gloo process group and shard
the model with FSDP2 (`models`); each takes its slice of every global batch.

Beside it: the typed batch and what is computed into it before the steps (`rollout_batch`), the
step loop, forward passes and optimizer step (`step`), the PPO critic (`critic`), `--offload-train`
(`offload`), cores (`placement`), CI checks and debug dumps (`diagnostics`), weight sync
(`slime.sync.syncer`). Frozen models: the reference, the old actor and the OPD teacher.
"""

from __future__ import annotations

import os
import random
import time
from argparse import Namespace
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from slime.backends.torch import checkpoint, lora, models, rollout_batch, step, sync_payload
from slime.backends.torch import device as devices
from slime.backends.torch.critic import Critic
from slime.backends.torch.data_parallel import DataParallel
from slime.backends.torch.diagnostics import save_debug_train_data
from slime.backends.torch.memory_recorder import MemoryRecorder
from slime.backends.torch.offload import TrainOffload
from slime.backends.torch.optim import build_optimizer, select_trainable
from slime.backends.torch.placement import RankCores
from slime.backends.torch.rollout_batch import BatchModels, RolloutBatch
from slime.backends.torch.sync_payload import AdapterSync
from slime.engine.client import set_default_timeout as set_engine_timeout
from slime.observability.ci_checks import check_logprob_diff
from slime.observability.profile_utils import TrainProfiler
from slime.runtime.core_lending import Lender
from slime.runtime.threads import configure_torch_threads
from slime.sync.syncer import WeightSyncer, select_syncer, transport_for
from slime.sync.tensor import engine_sequence_log_probs
from slime.utils.accelerator import check_bf16
from slime.utils.api_keys import register as register_keys


class TrainActor:
    # One forward where one suffices (`can_reuse_training_forward`). Tests and bench/train_step.py
    # set it False to force the separate old-log-prob pass and compare.
    reuse_training_forward = True

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
        self.dp = DataParallel(rank, world_size)  # the megatron backend's tensor-parallel ranks share one
        self.master_addr, self.master_port, self.num_threads = master_addr, master_port, num_threads
        self.requested_device = device  # None: CUDA (one GPU per rank) when torch sees one, else the CPU
        self.cores = RankCores()
        self.syncer: WeightSyncer | None = None  # chosen by transport at rank 0's first sync
        self.adapter_sync: AdapterSync | None = None  # a LoRA policy's: syncs the adapter alone
        self.offload_state = TrainOffload(os.path.join(args.run_dir, "offload"))  # --offload-train

    # ------------------------------------------------------------------ set-up
    def init(self) -> int:
        """Load policy (and reference), build the optimizer, resume; return the first rollout id."""
        a = self.args
        configure_torch_threads(self.num_threads)
        torch.manual_seed(a.seed + self.rank)
        random.seed(a.seed + self.rank)
        if a.deterministic_mode:  # as slime's Megatron initialisation
            torch.use_deterministic_algorithms(True)
        self.prof = TrainProfiler(a, self.rank)  # --use-pytorch-profiler
        self.memory = MemoryRecorder(a, self.rank)  # --record-memory-history --memory-recorder memray
        self.device = devices.select_device(self.rank, self.requested_device)
        if a.bf16:  # before any weight is loaded: a device without bf16 stops here
            check_bf16(self.device)
        if self.world_size > 1:
            os.environ.update(MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))
            # a collective waits --distributed-timeout-minutes (slime: 10) for a rank that died, not gloo's 30
            dist.init_process_group(
                devices.process_group_backend(self.device),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(minutes=a.distributed_timeout_minutes),
            )
        set_engine_timeout(a.engine_control_timeout_secs)
        self._load_models()
        self.pad_id = self.model.config.pad_token_id or 0
        start = self.load_checkpoint(a.load) if a.load else 0
        self._snapshot_old_actor()
        self.cores.install(self.model, self.num_threads, self.device)
        self.prof.on_init_end()
        return start

    def _load_models(self) -> None:
        a = self.args
        # the initial policy is --ref-load's weights (= --hf-checkpoint unless given), as slime's
        # training starts from --ref-load when --load holds no checkpoint
        self.model = models.load_policy(a.ref_load, self.device, a.recompute_granularity is not None)
        if a.enable_lora:  # before sharding and the optimizer: only the adapter trains
            lora.apply(self.model, a)
        self.adapter_sync = AdapterSync(self.model) if a.enable_lora else None
        # --only-train / --freeze-params-name-list: before sharding, so FSDP sees the final requires_grad
        trainable = select_trainable(self.model, a.only_train_params_name_list, a.freeze_params_name_list)
        if self.world_size > 1:
            models.shard(self.model)
        self.ref_model, self.teacher_model, self.old_actor = models.load_frozen_models(a, self.device, self.model)
        self.critic = Critic(a, self.world_size, fully_shard) if a.use_critic else None
        if self.world_size > 1:  # fully_shard swapped the parameters for sharded ones
            trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_optimizer(trainable, a, lr=a.lr, warmup=a.lr_warmup_iters)

    def _snapshot_old_actor(self) -> None:
        if self.old_actor is not None:
            self.copy_policy_into(self.old_actor)

    def copy_policy_into(self, frozen: torch.nn.Module) -> None:
        """A frozen copy (the old actor; the reference at --ref-update-interval) takes the policy's weights."""
        frozen.load_state_dict(models.full_state_every_rank(self.model, self.world_size))

    def is_rank0(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ training
    def train(self, rollout_id: int, data: dict[str, Any]) -> dict[str, float]:
        """One rollout's worth of optimizer steps. Returns rank-averaged metrics."""
        devices.reset_peak_memory(self.device)
        with self.cores.borrowing(), devices.autocast(self.device, self.args.bf16, self.args.fp16):  # --bf16 / --fp16
            metrics = self._train(rollout_id, data)
        metrics.update(self.cores.take_metrics())
        metrics.update(devices.memory_metrics(self.device))  # GPU memory of this rank (nothing on the CPU)
        return metrics

    def _train(self, rollout_id: int, data: dict[str, Any]) -> dict[str, float]:
        a, t0 = self.args, time.perf_counter()
        critic_only = self.critic is not None and rollout_id < a.num_critic_only_steps
        batch, extra = self._prepare(rollout_id, data, critic_only)
        if a.save_debug_train_data is not None:
            save_debug_train_data(a, rollout_id, batch, self.rank, self.world_size, self.dp.rank)
        with self.prof.phase("train_actor"):
            metrics = step.train_steps(self, batch, rollout_id, critic_only)
        if batch.old_from_training_forward:
            extra.update(rollout_batch.reused_forward_metrics(batch, self.dp.sum))
        metrics = step.all_reduce_mean({**metrics, **extra}, self.world_size)
        check_logprob_diff(a, rollout_id, metrics)  # --ci-test
        metrics["perf/train_time"] = time.perf_counter() - t0
        self.prof.step()
        self.memory.step(rollout_id)
        return metrics

    def _prepare(self, rollout_id: int, data: dict[str, Any], critic_only: bool) -> tuple[RolloutBatch, dict]:
        """This rank's share of every global batch as a typed batch, and the rollout metrics."""
        a = self.args
        mine = rollout_batch.rank_positions(a, [len(t) for t in data["tokens"]], self.dp.rank, self.dp.size)
        steps = len(range(0, len(mine), a.global_batch_size // self.dp.size))
        reuse = self.reuse_training_forward and rollout_batch.can_reuse_training_forward(
            a, self.model, self.old_actor, steps, critic_only
        )
        if a.loss_type == "sft_loss" or not a.compute_advantages_and_returns:
            batch = rollout_batch.prepare_plain_batch(a, data, mine, rollout_id)
            batch.old_from_training_forward = reuse
            return batch, {}
        with self.prof.phase("train_log_probs"):
            return rollout_batch.prepare_rl_batch(self._batch_models(), data, mine, rollout_id, reuse)

    def _batch_models(self) -> BatchModels:
        models_ = (self.model, self.old_actor, self.ref_model, self.teacher_model, self.critic)
        return BatchModels(self.args, self._forward_only, *models_, self.dp.sum, self.dp.rank)

    def _forward_only(
        self, data: Any, indices: list[int], model: torch.nn.Module, entropy_out: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Per-sample response log-probs of `model` (no grad); entropies appended to `entropy_out`."""
        return step.forward_log_probs(self, data, indices, model, entropy_out)

    def _optimizer_step(self, batch: RolloutBatch, positions: list[int], reduce_kw: dict) -> dict[str, float]:
        return step.optimizer_step(self, batch, positions, reduce_kw)

    # ------------------------------------------------------------------ weights
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full, unsharded weights (a collective when sharded; every rank must call)."""
        return models.full_state(self.model, self.world_size)

    def reset_weight_sync(self) -> None:
        """An engine was restarted: the syncer sets up anew what it keeps per engine."""
        if self.syncer is not None:
            self.syncer.reset()

    def close_weight_sync(self) -> None:
        """The run is ending: release what the syncer holds (a /dev/shm buffer outlives a killed process)."""
        if self.syncer is not None:
            self.syncer.close()
            self.syncer = None

    def weight_sync_path(self, state: dict[str, torch.Tensor]) -> str:
        """Which transport a full sync takes: `disk`, `shm`, `ipc` or `collective` (`transport_for`)."""
        return transport_for(self.args, state)

    def update_weights(self, engine_urls: list[str], weight_version: str) -> dict[str, float]:
        """Push the current weights into every engine (rank 0 sends; all ranks gather). Returns
        the sync's metrics: perf/update_weights_time, and the transport's own (bytes written, ...)."""
        t0 = time.perf_counter()
        register_keys(engine_urls, self.args.engine_api_key, self.args.engine_admin_api_key)
        p = sync_payload.payload(self, engine_urls)  # the weights, or a LoRA policy's adapter
        metrics: dict[str, float] = {}
        if self.is_rank0() and engine_urls:
            if self.syncer is None:
                self.syncer = select_syncer(self.args, p.state)
            metrics.update(self.syncer.sync(engine_urls, p.state, weight_version, lora=p.lora, snapshot=p.snapshot))
            metrics.update(p.metrics())
        self._snapshot_old_actor()  # the engines now serve these weights
        metrics["perf/update_weights_time"] = time.perf_counter() - t0
        return metrics

    def check_weight_parity(self, engine_url: str, token_ids: list[int]) -> float:
        """Mean |engine - trainer| log-prob of a fixed sequence (call right after a sync)."""
        register_keys([engine_url], self.args.engine_api_key, self.args.engine_admin_api_key)
        engine_lp = torch.as_tensor(engine_sequence_log_probs(engine_url, token_ids))
        return float((step.sequence_log_probs(self, token_ids) - engine_lp).abs().mean())

    def save(self, rollout_id: int) -> str:
        return checkpoint.save(self, rollout_id)

    def load_checkpoint(self, path: str) -> int:
        """Resume from `--load` (weights, optimizer, RNG); the next rollout id."""
        return checkpoint.load(self, path)

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
        return self.cores.pin(cores, num_threads, lenders)

    def offload(self) -> dict[str, float]:
        """--offload-train: optimizer state (critic's too) to a file, gradients dropped, until `onload`."""
        critic = [self.critic] if self.critic is not None else []
        optimizers, modules = [self.optimizer, *(c.optimizer for c in critic)], [self.model, *(c.model for c in critic)]
        return self.offload_state.offload(optimizers, modules)

    def onload(self) -> dict[str, float]:
        """The offloaded optimizer state back in memory, bit-identical (a no-op when not offloaded)."""
        return self.offload_state.onload()


RayTrainActor = ray.remote(TrainActor)
