"""slime's Megatron plugin hooks, called at the same points of the fsdp trainer.

* ``--custom-megatron-before-train-step-hook-path``:
  ``fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)`` at the start of each
  optimizer step (gradients zeroed, before the step's first forward), for the policy and, under
  PPO, for the critic (slime's critic is a trainer of its own that calls it too). ``step_id``
  counts the rollout's optimizer steps from 0.
* ``--custom-megatron-before-log-prob-hook-path``: ``fn(args, model, store_prefix)`` before each
  no-grad log-prob pass: ``""`` for the policy's own log-probs (the old ones, or the trainer's
  log-probs beside the engine's with --get-mismatch-metrics; --keep-old-actor's copy too),
  ``"ref_"`` for the reference model, ``"teacher_"`` for the OPD teacher, as slime's prefixes.

With ``--train-backend megatron`` the hooks get Megatron's own objects, as under slime: ``model`` is
``[DistributedDataParallel(GPTModel)]`` (a frozen copy's ``[GPTModel]`` before its log-prob pass),
``optimizer`` Megatron's optimizer, ``opt_param_scheduler`` Megatron's ``OptimizerParamScheduler``.

What the fsdp backend's hooks receive in place of Megatron's objects: ``model`` is a one-element list holding
the module (Megatron's is the list of the rank's model chunks; here each rank holds one, a
transformers model, FSDP2-sharded when there are several ranks, so its parameters are then
DTensors); ``optimizer`` is the torch optimizer (AdamW, or `StatelessAdam`); and
``opt_param_scheduler`` is the ``torch.optim.lr_scheduler.LambdaLR`` that sets the learning rate
of every step. The hook is imported (and its signature checked, slime.preflight) before the run
starts, and looked up at each call as slime's does.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any, Protocol

import torch

from slime.utils.misc import load_function


class Trains(Protocol):
    """What a train-step hook is given (a `TrainActor` for the policy, a `Critic`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any


def before_train_step(args: Namespace, rollout_id: int, step_id: int, trains: Trains) -> None:
    path = args.custom_megatron_before_train_step_hook_path
    if path:
        fn = load_function(path, arg_name="--custom-megatron-before-train-step-hook-path")
        fn(args, rollout_id, step_id, _chunks(trains.model), trains.optimizer, trains.scheduler)


def before_log_prob(args: Namespace, model: torch.nn.Module, store_prefix: str) -> None:
    path = args.custom_megatron_before_log_prob_hook_path
    if path:
        fn = load_function(path, arg_name="--custom-megatron-before-log-prob-hook-path")
        fn(args, _chunks(model), store_prefix)


def _chunks(model: torch.nn.Module) -> list[Any]:
    """The rank's model chunks as slime hands them over: the megatron backend's own Megatron module
    (the policy's DistributedDataParallel, a frozen copy's GPTModel), else the module itself."""
    return [model.megatron_chunk if hasattr(model, "megatron_chunk") else model]
