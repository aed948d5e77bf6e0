"""AdamW and Megatron's learning-rate schedule (``--lr-decay-style``, ``--lr-warmup-iters``, ``--min-lr``).

The learning rate of optimizer step ``k`` (0-based, counted over the whole run):

* warmup (``k < warmup``): ``lr * k / warmup`` (Megatron starts warmup at 0);
* then, with ``ratio = (k - warmup) / (decay_iters - warmup)`` clamped to [0, 1]:
  ``constant``: ``lr``; ``linear``: ``min_lr + (lr - min_lr) * (1 - ratio)``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * ratio)) / 2``.

Megatron's default style is ``linear``; ours is ``constant`` so runs that do not ask for a schedule
train as before (slime's example scripts all pass ``--lr-decay-style constant``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def lr_at(step: int, lr: float, *, style: str = "constant", warmup: int = 0, decay_iters: int | None = None,
          min_lr: float = 0.0) -> float:
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


def build_optimizer(params: Iterable[torch.nn.Parameter], args, *, lr: float, warmup: int
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with slime's ``--adam-*`` / ``--weight-decay`` and a per-step schedule (call ``scheduler.step()``
    after each ``optimizer.step()``)."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                                  weight_decay=args.weight_decay)
    min_lr = min(args.min_lr, lr)

    def factor(step: int) -> float:
        if lr == 0:
            return 1.0
        return lr_at(step, lr, style=args.lr_decay_style, warmup=warmup, decay_iters=args.lr_decay_iters,
                     min_lr=min_lr) / lr

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
