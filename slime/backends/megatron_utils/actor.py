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

Checkpoints are Megatron's torch_dist beside the HF files (`checkpoint.py`). Not yet here:
pipeline and context parallelism, the critic, LoRA. `--train-backend megatron` runs it through Ray
(`slime.ray.train_group`); those options are refused before the run starts (`check_run`, from
`slime.preflight`), each named.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import ray
import torch
import torch.distributed as dist

from slime.backends.megatron_utils import checkpoint as megatron_checkpoint
from slime.backends.megatron_utils import cpu_support, initialize
from slime.backends.megatron_utils import model as megatron_model
from slime.backends.megatron_utils.model_provider import Layout
from slime.backends.torch import step
from slime.backends.torch.actor import TrainActor
from slime.backends.torch.data_parallel import DataParallel
from slime.backends.torch.rollout_batch import RolloutBatch
from slime.errors import SlimeError
from slime.utils.net import free_port


class MegatronCausalLM(torch.nn.Module):
    """A GPTModel answering as a transformers causal LM does (`model(input_ids=...).logits`, the
    vocabulary gathered whole over the tensor-parallel ranks), so the FSDP path's batching and
    losses run on it. Right-padded micro-batches: Megatron's causal mask keeps padding out of every
    real token's attention. Packed ones (`--use-dynamic-batch-size`: samples in one row, a
    block-diagonal causal mask): the mask is handed to Megatron's attention; RoPE then counts
    positions along the row rather than from each sample's start, which changes no attention score
    (rotary embeddings depend on the distance between two positions only, and the mask keeps each
    token inside its own sample). With sequence parallelism Megatron splits the sequence over the
    tensor-parallel ranks, so a row is padded at its end to a multiple of their number (causal
    attention keeps the padding out of every real token's)."""

    def __init__(self, gpt: Any, hf_config: Any, chunk: Any = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.config = hf_config  # what the batching reads of a model (pad token, dropout: Megatron's is 0)
        # what slime's Megatron hooks get as the rank's model chunk: the policy's DDP wrapper, a frozen
        # copy's GPTModel (in a tuple: not a submodule, so the state dict holds each weight once)
        self._chunk = (chunk if chunk is not None else gpt,)

    @property
    def megatron_chunk(self) -> Any:
        return self._chunk[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> SimpleNamespace:
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        # Megatron masks where True; the batching's 4-D mask (packed rows) is True where a token attends
        mask = ~attention_mask if attention_mask is not None and attention_mask.dim() == 4 else None
        length, config = input_ids.shape[1], self.gpt.config
        extra = -length % config.tensor_model_parallel_size if config.sequence_parallel else 0
        if extra:
            input_ids = torch.nn.functional.pad(input_ids, (0, extra))
            position_ids = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, extra + 1)], dim=1)
            if mask is not None:  # the padding attends nowhere and nothing attends to it
                mask = torch.nn.functional.pad(mask, (0, extra, 0, extra), value=True)
        logits = self.gpt(input_ids, position_ids, mask)[:, :length]  # [b, s, vocab / tp]
        return SimpleNamespace(logits=gather_from_tensor_model_parallel_region(logits))

    def save_pretrained(self, out: Any, state_dict: dict[str, torch.Tensor], safe_serialization: bool = True) -> None:
        """`state_dict` (transformers' names) as a Hugging Face model directory's config and weights."""
        from safetensors.torch import save_file

        self.config.save_pretrained(out)
        if self.config.tie_word_embeddings:  # transformers ties it back on load; safetensors refuses shared storage
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        save_file({k: v.contiguous() for k, v in state_dict.items()}, f"{out}/model.safetensors", {"format": "pt"})

    @classmethod
    def frozen(cls, hf_config: Any, hf_state: dict[str, torch.Tensor], layout: Layout) -> MegatronCausalLM:
        """A copy that never trains (reference, old actor, OPD teacher)."""
        return cls(megatron_model.build_frozen(hf_config, hf_state, layout), hf_config).eval()

    @classmethod
    def frozen_from(cls, path: str, layout: Layout) -> MegatronCausalLM:
        return cls.frozen(*megatron_model.read_hf(path), layout)


def unsupported(a: Any) -> list[str]:
    """The options of a run that this backend cannot serve yet (checked before the run starts)."""
    checks = [
        (f"--pipeline-model-parallel-size {a.pipeline_model_parallel_size}", a.pipeline_model_parallel_size != 1),
        (f"--context-parallel-size {a.context_parallel_size}", a.context_parallel_size != 1),
        ("a critic (--advantage-estimator ppo)", a.use_critic),
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
        self.critic = None
        self.adapter_sync = None

    def copy_policy_into(self, frozen: torch.nn.Module) -> None:
        """Every rank copies its own shards: the frozen copies are split as the policy is."""
        frozen.load_state_dict(self.model.state_dict())

    def _optimizer_step(self, batch: RolloutBatch, positions: list[int], reduce_kw: dict) -> dict[str, float]:
        """One optimizer step through Megatron's schedule, each micro-batch's loss the FSDP step's."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        a = self.args
        plan = step.plan(a, batch.sequences, positions)
        micro_batches = [step.micro_batch(self, batch.sequences, idx) for idx in plan]
        n = len(micro_batches)
        stats: dict[str, float] = {}

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            loss, parts = step._micro_batch_loss(self, batch, next(data), reduce_kw)
            for k, v in parts.items():  # each part is already this micro-batch's share of the step
                stats[k] = stats.get(k, 0.0) + float(v.detach())
            # the schedule divides a micro-batch's loss by their number; this one is its share already
            return loss, lambda out: (out * n, {})

        lr = self.optimizer.param_groups[0]["lr"]  # the scheduler set it after the last step
        with cpu_support.cuda_calls_on_cpu():
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(micro_batches),
                model=[self.policy.ddp],
                num_microbatches=n,
                seq_length=int(micro_batches[0].input_ids.shape[1]),
                micro_batch_size=micro_batches[0].size,
                forward_only=False,
            )
            _, grad_norm, _ = self.optimizer.step()
            # as megatron.training: the schedule moves after the step; the gradients are cleared for
            # the next one now, so a before-train-step hook sees them zeroed, as slime's does
            self.scheduler.step(increment=1)
            self.policy.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
        stats["train/lr"] = lr
        stats["train/grad_norm"] = float(grad_norm)
        return stats

    def save(self, rollout_id: int) -> str:
        return megatron_checkpoint.save(self, rollout_id)

    def load_checkpoint(self, path: str) -> int:
        return megatron_checkpoint.load(self, path)

    def offload(self) -> dict[str, float]:
        """--offload-train: Adam's state (inside Megatron's optimizer) to a file until `onload`. The
        gradients live in DDP's buffer, which every step zeroes: it stays."""
        return self.offload_state.offload(megatron_model.torch_optimizers(self.optimizer), [self.model])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights under transformers' names (a collective over the tensor-parallel ranks)."""
        return megatron_model.hf_state(self.policy)


RayMegatronTrainActor = ray.remote(MegatronTrainActor)
