"""A Megatron policy that trains: the GPTModel in Megatron's DistributedDataParallel, Megatron's
optimizer (Adam, gradient clipping by the global norm over every rank), and one optimizer step over
micro-batches through Megatron's forward-backward schedule.

Per-token log-probs come from Megatron's vocabulary-parallel cross entropy, so the logits stay split
over the tensor-parallel ranks. The loss of a micro-batch is the caller's (`LossFn`): the schedule
averages it over the micro-batches and DDP averages the gradients over the data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from slime.backends.megatron_utils import cpu_support, hf_weights, model_provider
from slime.backends.megatron_utils.model_provider import Layout

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (log-probs [b, s-1], tokens [b, s]) -> loss


@dataclass
class OptimizerSettings:
    lr: float
    min_lr: float = 0.0  # the floor of a decaying schedule (each parameter group carries it)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    distributed: bool = False  # --use-distributed-optimizer: Adam's state sharded over the data-parallel ranks


@dataclass
class MegatronPolicy:
    model: Any  # the GPTModel
    ddp: Any  # Megatron's DistributedDataParallel around it
    optimizer: Any
    tensor_parallel: int
    tied: bool


def build_policy(
    hf_config: Any,
    hf_state: dict[str, torch.Tensor],
    opt: OptimizerSettings,
    layout: Layout | None = None,
    value_head: torch.nn.Linear | None = None,
) -> MegatronPolicy:
    """The policy from an HF config and full HF weights (Megatron's parallel state must be set up;
    `layout`: by default the tensor-parallel size of that state, nothing else). With `value_head`,
    the critic: the same backbone with that head's weights as its output layer."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    tp = parallel_state.get_tensor_model_parallel_world_size()
    tied = bool(hf_config.tie_word_embeddings) and value_head is None
    layout = layout or Layout(tp)
    with cpu_support.cuda_calls_on_cpu():
        rank = parallel_state.get_tensor_model_parallel_rank()
        if value_head is None:
            model = model_provider.build_gpt_model(hf_config, layout)
            hf_weights.load_hf_weights(model, hf_state, rank, tp, tied)
        else:  # the backbone from HF (its lm_head left out, as for a tied model), the head's own weights
            model = model_provider.build_value_model(hf_config, layout)
            head = {f"output_layer.{k}": v for k, v in value_head.state_dict().items()}
            hf_weights.load_hf_weights(model, hf_state, rank, tp, tied=True, extra=head)
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=opt.distributed)
        ddp = DistributedDataParallel(model.config, ddp_config, model)
        # what megatron.training's loop sets: the schedule then averages the gradients over the
        # data-parallel ranks after the last micro-batch (without it each rank steps on its own)
        model.config.finalize_model_grads_func = finalize_model_grads
        model.config.no_sync_func = ddp.no_sync
        config = OptimizerConfig(
            optimizer="adam",
            lr=opt.lr,
            min_lr=opt.min_lr,
            weight_decay=opt.weight_decay,
            adam_beta1=opt.adam_beta1,
            adam_beta2=opt.adam_beta2,
            adam_eps=opt.adam_eps,
            clip_grad=opt.clip_grad,
            params_dtype=torch.float32,
            use_distributed_optimizer=opt.distributed,
        )
        optimizer = get_megatron_optimizer(config, [ddp])
    return MegatronPolicy(model, ddp, optimizer, tp, tied)


def lr_scheduler(optimizer: Any, args: Any, lr: float | None = None, warmup: int | None = None) -> Any:
    """Megatron's OptimizerParamScheduler with slime's options (--lr, --min-lr, --lr-warmup-iters,
    --lr-decay-iters, --lr-decay-style, --lr-warmup-init; weight decay constant, as slime's
    defaults): the learning rate of the first step is set now, each later one by `step(1)`. The
    critic's: `lr`, `warmup` (--critic-lr, --critic-lr-warmup-iters), the rest shared, as slime's
    critic trainer takes them."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    lr = args.lr if lr is None else lr
    warmup = args.lr_warmup_iters if warmup is None else warmup
    with cpu_support.cuda_calls_on_cpu():
        return OptimizerParamScheduler(
            optimizer,
            init_lr=args.lr_warmup_init,
            max_lr=lr,
            min_lr=min(args.min_lr, lr),
            lr_warmup_steps=warmup,
            lr_decay_steps=max(args.lr_decay_iters, warmup + 1),  # Megatron asserts it (constant style)
            lr_decay_style=args.lr_decay_style,
            start_wd=args.weight_decay,
            end_wd=args.weight_decay,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )


def schedule_step(
    policy: MegatronPolicy,
    scheduler: Any,
    micro_batches: list[Any],
    loss_of: Callable[[Any], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> tuple[dict[str, float], float, float]:
    """One optimizer step of `policy` (the policy or the critic) over `micro_batches` through
    Megatron's forward-backward schedule. `loss_of(mb)`: a micro-batch's share of the step's loss
    and the parts it logs (summed here). Then Megatron's optimizer steps, the LR schedule moves (as
    megatron.training: after the step) and the gradients are cleared for the next one, so a
    before-train-step hook sees them zeroed, as slime's does. Returns the summed parts, the step's
    learning rate and the gradient norm before clipping."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    n = len(micro_batches)
    stats: dict[str, float] = {}

    def forward_step(data: Iterator[Any], model: Any) -> tuple[torch.Tensor, Callable]:
        loss, parts = loss_of(next(data))
        for k, v in parts.items():
            stats[k] = stats.get(k, 0.0) + float(v.detach())
        # the schedule divides a micro-batch's loss by their number; this one is its share already
        return loss, lambda out: (out * n, {})

    lr = policy.optimizer.param_groups[0]["lr"]  # the scheduler set it after the last step
    with cpu_support.cuda_calls_on_cpu():
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[policy.ddp],
            num_microbatches=n,
            seq_length=int(micro_batches[0].input_ids.shape[1]),
            micro_batch_size=micro_batches[0].size,
            forward_only=False,
        )
        _, grad_norm, _ = policy.optimizer.step()
        scheduler.step(increment=1)
        policy.ddp.zero_grad_buffer()
        policy.optimizer.zero_grad()
    return stats, lr, float(grad_norm)


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside Megatron's (its wrappers keep Adam's state in them)."""
    return [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def build_frozen(hf_config: Any, hf_state: dict[str, torch.Tensor], layout: Layout | None = None) -> Any:
    """A GPTModel that never trains (reference, old actor, teacher), split as the policy is."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    layout = Layout(tp, layout.sequence_parallel) if layout else Layout(tp)  # no backward: nothing to recompute
    with cpu_support.cuda_calls_on_cpu():
        model = model_provider.build_gpt_model(hf_config, layout)
        tied = bool(hf_config.tie_word_embeddings)
        hf_weights.load_hf_weights(model, hf_state, parallel_state.get_tensor_model_parallel_rank(), tp, tied)
    return model.eval().requires_grad_(False)


def read_hf(path: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """An HF checkpoint's config and fp32 weights (what a Megatron model is built from)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    return AutoConfig.from_pretrained(path), AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32
    ).state_dict()


def token_log_probs(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for every t, [b, s-1] (right padding only: causal)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    logits = model(tokens, positions, None)  # [b, s, vocab / tp]
    sbv = logits[:, :-1].transpose(0, 1).contiguous()
    return -vocab_parallel_cross_entropy(sbv, tokens[:, 1:].transpose(0, 1).contiguous()).transpose(0, 1)


def train_step(policy: MegatronPolicy, micro_batches: list[torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
    """One optimizer step over `micro_batches` (token tensors [b, s], all of one shape). Returns the
    mean loss over the micro-batches and the gradient norm before clipping."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batch, seq = micro_batches[0].shape

    def forward_step(data: Iterator[torch.Tensor], model: Any) -> tuple[torch.Tensor, Callable]:
        tokens = next(data)
        log_probs = token_log_probs(model, tokens)

        def loss(lp: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            value = loss_fn(lp, tokens)
            return value, {"loss": value.detach().clone()}  # the schedule scales `value` in place

        return log_probs, loss

    with cpu_support.cuda_calls_on_cpu():
        policy.ddp.zero_grad_buffer()
        policy.optimizer.zero_grad()
        out = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[policy.ddp],
            num_microbatches=len(micro_batches),
            seq_length=seq,
            micro_batch_size=batch,
            forward_only=False,
        )
        _, grad_norm, _ = policy.optimizer.step()
    losses = [float(o["loss"]) for o in out]
    return {"loss": sum(losses) / len(losses), "grad_norm": float(grad_norm)}


def hf_state(policy: MegatronPolicy) -> dict[str, torch.Tensor]:
    """The full weights under transformers' names (a collective over the tensor-parallel ranks)."""
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    params = dict(policy.model.named_parameters())
    return hf_weights.to_hf(params, policy.model.config, policy.tensor_parallel, group, policy.tied)
