"""Cluster shape: trainer ranks, engine slots, colocation. On CPU a "GPU" is a worker process slot."""

from __future__ import annotations

import argparse

from slime.arguments.checks import require_positive
from slime.errors import SlimeError

TRAIN_BACKENDS = ("fsdp", "megatron")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1,
                   help="Training ranks per node (on CPU: trainer processes).")
    g.add_argument("--rollout-num-gpus", type=int, default=None,
                   help="Total engine slots (on CPU: engine worker processes x per-engine).")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true",
                   help="Engines and trainers share the machine and take turns (engine frees its KV cache while training).")
    g.add_argument("--train-backend", choices=TRAIN_BACKENDS, default="fsdp")
    g.add_argument("--train-num-threads", type=int, default=None,
                   help="torch threads per trainer process (default: cores shared without oversubscription).")


def finalize(args: argparse.Namespace) -> None:
    if args.train_backend == "megatron":
        raise SlimeError(
            "--train-backend megatron needs GPUs and Megatron-LM, which this installation does not have; "
            "use --train-backend fsdp (the default)"
        )
    require_positive(args, "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine")
    args.actor_world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = args.actor_world_size if args.colocate else args.rollout_num_gpus_per_engine
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise SlimeError(
            f"--rollout-num-gpus ({args.rollout_num_gpus}) must be a multiple of "
            f"--rollout-num-gpus-per-engine ({args.rollout_num_gpus_per_engine})"
        )
    args.num_engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
