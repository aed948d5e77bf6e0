"""The training rank on megatron-core: the FSDP `TrainActor`'s contract (batches, losses, metrics)
with a Megatron policy under it.

What changes against `slime.backends.torch.actor.TrainActor`: the policy is a megatron-core
GPTModel split over --tensor-model-parallel-size ranks, in Megatron's DistributedDataParallel over
the data-parallel ranks (the ranks of one tensor-parallel group share a data-parallel rank: the
same samples, `self.dp`); each optimizer step runs through Megatron's forward-backward schedule
with Megatron's optimizer; the weights that leave the rank are gathered into transformers' names.
What stays: the rollout batch, its log-probs, advantages and every loss (`step._micro_batch_loss`,
the same function the FSDP step calls on each micro-batch), so both backends compute the same
numbers.

The frozen models (the reference for KL, `--keep-old-actor`'s old actor, the OPD teacher of
`--opd-type megatron`) are GPTModels split as the policy is, read from their HF checkpoints.

The PPO critic is a GPTModel with a value head, trained beside the policy (`critic.py`).
Checkpoints are Megatron's torch_dist beside the HF files (`checkpoint.py`). Not yet here:
pipeline and context parallelism, LoRA. `--train-backend megatron` runs it through Ray
(`slime.ray.train_group`); those options are refused before the run starts (`check_run`, from
`slime.preflight`), each named.
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
import torch.distributed as dist

from slime.backends.megatron_utils import checkpoint as megatron_checkpoint
from slime.backends.megatron_utils import cpu_support, initialize
from slime.backends.megatron_utils import model as megatron_model
from slime.backends.megatron_utils.critic import MegatronCritic
from slime.backends.megatron_utils.hf_modules import MegatronCausalLM
from slime.backends.megatron_utils.model_provider import Layout
from slime.backends.torch import step
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.data_parallel import DataParallel
from slime.backends.torch.rollout_batch import RolloutBatch
from slime.errors import SlimeError
from slime.utils.net import free_port


def unsupported(a: Any) -> list[str]:
    """The options of a run that this backend cannot serve yet (checked before the run starts)."""
    checks = [
        (f"--pipeline-model-parallel-size {a.pipeline_model_parallel_size}", a.pipeline_model_parallel_size != 1),
        (f"--context-parallel-size {a.context_parallel_size}", a.context_parallel_size != 1),
        ("LoRA", a.enable_lora),
    ]
    return [name for name, used in checks if used]


def check_run(a: Any) -> None:
    """Before anything starts: megatron-core as tested, and no option this backend cannot serve."""
    cpu_support.check_version()
    missing = unsupported(a)
    if missing:
        raise SlimeError(f"--train-backend megatron does not support {', '.join(missing)} yet")


class MegatronTrainActor(TrainActor):
    def _load_models(self) -> None:
        a = self.args
        check_run(a)
        if not dist.is_initialized():  # Megatron's groups need a process group, even of one rank
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            dist.init_process_group("gloo", rank=0, world_size=1)
        initialize.init_megatron(a.tensor_model_parallel_size, a.seed)
        from megatron.core import parallel_state as ps

        # the ranks of one tensor-parallel group train on the same samples
        self.dp = DataParallel(
            ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_data_parallel_group()
        )
        hf_config, hf_state = megatron_model.read_hf(a.ref_load)  # the policy starts as the reference
        settings = megatron_model.OptimizerSettings(
            lr=a.lr,
            min_lr=min(a.min_lr, a.lr),
            adam_beta1=a.adam_beta1,
            adam_beta2=a.adam_beta2,
            adam_eps=a.adam_eps,
            weight_decay=a.weight_decay,
            clip_grad=a.clip_grad,
            distributed=a.use_distributed_optimizer,
        )
        layout = Layout.of(a)
        self.policy = megatron_model.build_policy(hf_config, hf_state, settings, layout)
        self.model = MegatronCausalLM(self.policy.model, hf_config, chunk=self.policy.ddp)
        self.model.train()
        self.optimizer = self.policy.optimizer
        self.scheduler = megatron_model.lr_scheduler(self.optimizer, a)
        uses_ref = a.use_kl_loss or a.kl_coef != 0.0
        self.ref_model = MegatronCausalLM.frozen(hf_config, hf_state, layout) if uses_ref else None
        del hf_state
        self.teacher_model = (
            MegatronCausalLM.frozen_from(a.opd_teacher_load, layout) if a.use_opd and a.opd_type == "megatron" else None
        )
        self.old_actor = MegatronCausalLM.frozen_from(a.hf_checkpoint, layout) if a.keep_old_actor else None
        self.critic = MegatronCritic(a, settings, layout) if a.use_critic else None
        self.adapter_sync = None

    def copy_policy_into(self, frozen: torch.nn.Module) -> None:
        """Every rank copies its own shards: the frozen copies are split as the policy is."""
        frozen.load_state_dict(self.model.state_dict())

    def _optimizer_step(self, batch: RolloutBatch, positions: list[int], reduce_kw: dict) -> dict[str, float]:
        """One optimizer step through Megatron's schedule, each micro-batch's loss the FSDP step's."""
        plan = step.plan(self.args, batch.sequences, positions)
        micro_batches = [step.micro_batch(self, batch.sequences, idx) for idx in plan]
        stats, lr, grad_norm = megatron_model.schedule_step(
            self.policy, self.scheduler, micro_batches, lambda mb: step._micro_batch_loss(self, batch, mb, reduce_kw)
        )
        return {**stats, "train/lr": lr, "train/grad_norm": grad_norm}

    def save(self, rollout_id: int) -> str:
        return megatron_checkpoint.save(self, rollout_id)

    def load_checkpoint(self, path: str) -> int:
        return megatron_checkpoint.load(self, path)

    def offload(self) -> dict[str, float]:
        """--offload-train: Adam's state (inside Megatron's optimizers: the critic's too) to a file until
        `onload`. The gradients live in DDP's buffers, which every step zeroes: they stay."""
        trained = [self, self.critic] if self.critic is not None else [self]
        optimizers = [o for t in trained for o in megatron_model.torch_optimizers(t.optimizer)]
        return self.offload_state.offload(optimizers, [t.model for t in trained])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights under transformers' names (a collective over the tensor-parallel ranks)."""
        return megatron_model.hf_state(self.policy)


RayMegatronTrainActor = ray.remote(MegatronTrainActor)
