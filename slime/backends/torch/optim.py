"""AdamW over the trainable parameters, Megatron's learning-rate schedule (``--lr-decay-style``,
``--lr-warmup-iters``, ``--min-lr``), slime's parameter freezing and optimizer-state reset.

The learning rate of optimizer step ``k`` (0-based, counted over the whole run):

* warmup (``k < warmup``): ``lr * k / warmup`` (Megatron starts warmup at 0);
* then, with ``ratio = (k - warmup) / (decay_iters - warmup)`` clamped to [0, 1]:
  ``constant``: ``lr``; ``linear``: ``min_lr + (lr - min_lr) * (1 - ratio)``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * ratio)) / 2``.

Megatron's default style is ``linear``; ours is ``constant`` so runs that do not ask for a schedule
train as before (slime's example scripts all pass ``--lr-decay-style constant``).

``--use-stateless-adam`` (slime's): `StatelessAdam` instead of AdamW, the policy's and the critic's.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Sequence

import torch

from slime.errors import SlimeError

logger = logging.getLogger(__name__)


def lr_at(
    step: int,
    lr: float,
    *,
    style: str = "constant",
    warmup: int = 0,
    decay_iters: int | None = None,
    min_lr: float = 0.0,
) -> float:
    """Learning rate of optimizer step ``step`` (see the module docstring)."""
    if warmup > 0 and step < warmup:
        return lr * step / warmup
    if style == "constant":
        return lr
    span = max((decay_iters or 0) - warmup, 1)
    ratio = min(max((step - warmup) / span, 0.0), 1.0)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ValueError(f"unknown lr decay style {style!r}")
    return min_lr + coeff * (lr - min_lr)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], args, *, lr: float, warmup: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with slime's ``--adam-*`` / ``--weight-decay`` and a per-step schedule (call ``scheduler.step()``
    after each ``optimizer.step()``)."""
    adam = StatelessAdam if args.use_stateless_adam else torch.optim.AdamW
    optimizer = adam(
        params, lr=lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, weight_decay=args.weight_decay
    )
    min_lr = min(args.min_lr, lr)

    def factor(step: int) -> float:
        if lr == 0:
            return 1.0
        return (
            lr_at(step, lr, style=args.lr_decay_style, warmup=warmup, decay_iters=args.lr_decay_iters, min_lr=min_lr)
            / lr
        )

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class StatelessAdam(torch.optim.Optimizer):
    """slime's ``--use-stateless-adam`` (slime/backends/megatron_utils/stateless_adam.py): AdamW whose
    moments start from zero at every step, so it keeps none (no per-parameter state, nothing to
    save). A bias-corrected first Adam step from zero moments has ``m_hat = g`` and
    ``v_hat = g * g``, so each step is ``p -= lr * g / (|g| + eps)`` after the decoupled decay
    ``p *= 1 - lr * weight_decay``: a sign-like update whose size does not depend on the betas
    (kept in the groups, as slime's, for code that reads them)."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0.0 or eps < 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"StatelessAdam: invalid lr {lr}, eps {eps} or betas {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if decay != 0.0:
                    param.mul_(1.0 - lr * decay)
                param.addcdiv_(grad, grad.abs().add_(eps), value=-lr)
        return loss


def select_trainable(
    model: torch.nn.Module, only_train: Sequence[str] | None, freeze: Sequence[str] | None
) -> list[torch.nn.Parameter]:
    """slime's ``--only-train-params-name-list`` / ``--freeze-params-name-list``: each pattern is a
    Python regex ``re.search``-ed in the parameter names (here the Hugging Face model's, e.g.
    ``model.layers.0.mlp.up_proj.weight``). With the first, a parameter trains iff some pattern
    matches; with the second, a parameter freezes iff some pattern matches. Frozen parameters get
    ``requires_grad=False`` and stay out of the optimizer, so no step (weight decay included) moves
    them. A pattern that matches nothing stops here: with HF names, Megatron-style patterns
    (``output_layer``, ``linear_fc1``) would otherwise silently train everything or nothing.
    Returns the trainable parameters."""
    named = list(model.named_parameters())
    check_param_patterns([n for n, _ in named], only_train, freeze)
    for option, patterns in (("--only-train-params-name-list", only_train), ("--freeze-params-name-list", freeze)):
        if not patterns:  # slime: an empty list is as if not given
            continue
        for n, param in named:
            if any(re.search(pat, n) for pat in patterns) != (option == "--only-train-params-name-list"):
                param.requires_grad_(False)
    trainable = [p for _, p in named if p.requires_grad]
    if not trainable:
        raise SlimeError("--freeze-params-name-list freezes every parameter of the model: nothing would train")
    frozen = len(named) - len(trainable)
    if frozen:
        logger.info("training %d of %d parameter tensors (%d frozen)", len(trainable), len(named), frozen)
    return trainable


def check_param_patterns(names: Sequence[str], only_train: Sequence[str] | None, freeze: Sequence[str] | None) -> None:
    """Every pattern of either list matches some name (cheap: callers may pass a checkpoint's tensor
    names before loading the model); else one line naming the option and the pattern."""
    for option, patterns in (("--only-train-params-name-list", only_train), ("--freeze-params-name-list", freeze)):
        for pat in patterns or ():
            if not any(re.search(pat, n) for n in names):
                raise SlimeError(
                    f"{option}: pattern {pat!r} matches no parameter of the model "
                    f"(names look like: {', '.join(names[:4])}, ...)"
                )


@torch.no_grad()
def reset_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """slime's ``--reset-optimizer-states``: Adam's step count and both moments back to zero (in
    place, so sharded states stay sharded); the next step is a first step again, bias correction
    included. The learning-rate schedule is not touched."""
    for state in optimizer.state.values():
        if "step" in state:
            if isinstance(state["step"], torch.Tensor):
                state["step"].zero_()
            else:
                state["step"] = 0
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in state:
                state[key].zero_()
