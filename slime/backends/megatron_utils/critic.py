"""The PPO critic on megatron-core: the policy's backbone with a value head as the GPTModel's output
layer (slime's `LinearForLastLayer`), split over the tensor-parallel ranks as the policy is, in its
own DistributedDataParallel with its own Megatron optimizer and LR schedule (--critic-lr,
--critic-lr-warmup-iters; the rest of the schedule shared, as slime's critic trainer takes it).

It lives in the training rank beside the policy, as the fsdp backend's critic does
(`slime.backends.torch.critic`, whose value pass, clipped value loss and micro-batching this reuses),
and starts from the same weights: --critic-load's backbone and a value head drawn from --seed alone,
so both backends' critics compute the same values and the same first update.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from slime.backends.megatron_utils import model as megatron_model
from slime.backends.megatron_utils.hf_modules import MegatronValueModel
from slime.backends.megatron_utils.model_provider import Layout
from slime.backends.torch.critic import Critic, value_head
from slime.backends.torch.rollout_batch import RolloutBatch


class MegatronCritic(Critic):
    def __init__(self, args: Namespace, settings: megatron_model.OptimizerSettings, layout: Layout) -> None:
        self.args = args
        hf_config, hf_state = megatron_model.read_hf(args.critic_load)
        settings = megatron_model.OptimizerSettings(**{**vars(settings), "lr": args.critic_lr})
        head = value_head(hf_config.hidden_size, args.seed)
        self.policy = megatron_model.build_policy(hf_config, hf_state, settings, layout, value_head=head)
        self.model = MegatronValueModel(self.policy.model, hf_config, chunk=self.policy.ddp)
        self.model.train()
        self.optimizer = self.policy.optimizer
        self.scheduler = megatron_model.lr_scheduler(
            self.optimizer, args, lr=args.critic_lr, warmup=args.critic_lr_warmup_iters
        )

    def train_step(self, batch: RolloutBatch, positions: list[int], reduce_kw: dict[str, Any]) -> dict[str, float]:
        """One optimizer step of the clipped value loss through Megatron's schedule."""
        stats, lr, grad_norm = megatron_model.schedule_step(
            self.policy,
            self.scheduler,
            self.micro_batches(batch, positions),
            lambda mb: self.micro_batch_loss(batch, mb, reduce_kw),
        )
        return {**stats, "train/critic_lr": lr, "train/critic_grad_norm": grad_norm}
