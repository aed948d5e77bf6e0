"""Cluster shape: trainer ranks, engine slots, colocation. On CPU a "GPU" is a worker process slot."""

from __future__ import annotations

import argparse

from slime.arguments.checks import require_positive
from slime.errors import SlimeError

TRAIN_BACKENDS = ("fsdp", "megatron")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--actor-num-nodes",
        type=int,
        default=1,
        help="Nodes for the trainer (trainer ranks = this x --actor-num-gpus-per-node).",
    )
    g.add_argument(
        "--actor-num-gpus-per-node", type=int, default=1, help="Training ranks per node (on CPU: trainer processes)."
    )
    g.add_argument(
        "--rollout-num-gpus",
        type=int,
        default=None,
        help="Total engine slots (on CPU: engine worker processes x per-engine).",
    )
    g.add_argument(
        "--rollout-num-gpus-per-engine",
        type=int,
        default=1,
        help="Devices per inference engine (its tensor-parallel size): engines = --rollout-num-gpus / this.",
    )
    g.add_argument(
        "--colocate",
        action="store_true",
        help="Engines and trainers share the machine and take turns (engine frees its KV cache while "
        "training). Turning this on will also set --offload to true.",
    )
    # slime's offload options: None means "not given", resolved in finalize (slime's rules)
    g.add_argument(
        "--offload", action="store_true", default=False, help="Equivalent to --offload-train + --offload-rollout. "
    )
    g.add_argument(
        "--offload-train",
        action=argparse.BooleanOptionalAction,
        help="Whether to offload the training actor during rollout (on CPU: its optimizer state goes "
        "to a file in the run directory and its gradients are freed, restored bit-exactly before "
        "the next step). This will always be true when --colocate is set.",
    )
    g.add_argument(
        "--offload-rollout",
        action=argparse.BooleanOptionalAction,
        help="Whether to offload the rollout generator during training (the engines release their KV "
        "cache). This will always be true when --colocate is set.",
    )
    g.add_argument(
        "--release-train",
        action="store_true",
        default=False,
        help="Release Megatron training actors during rollout and recreate them before each train step. "
        "Requires disk weight sync and --save for Megatron reload.",
    )
    g.add_argument(
        "--train-backend",
        choices=TRAIN_BACKENDS,
        default="fsdp",
        help="fsdp (torch FSDP2) or megatron (megatron-core: tensor, sequence and data parallel; docs/megatron.md); both run "
        "on the CPU too.",
    )
    _add_cpu_arguments(g)


def _add_cpu_arguments(g: argparse._ArgumentGroup) -> None:
    """How the CPU's cores and threads are shared between the processes."""
    g.add_argument(
        "--train-num-threads",
        type=int,
        default=None,
        help="torch threads per trainer process (default: cores shared without oversubscription).",
    )
    g.add_argument(
        "--lend-idle-cores",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Disaggregated on the CPU: a built-in engine's cores go to a trainer rank on its node while "
        "the engine has nothing to run (the trainer re-pins itself and adds threads between decoder "
        "layers, and gives them back at the end of each train call). --no-lend-idle-cores keeps "
        "every process on its own share.",
    )
    g.add_argument(
        "--mkl-vendor-shim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="On an x86 CPU not made by Intel (AMD, Hygon) with AVX2: preload a one-function library into "
        "the processes that run the model (Ray workers of a local cluster, built-in engines) so that "
        "Intel MKL, torch's CPU BLAS, picks its matrix kernels by the CPU's instruction sets rather "
        "than its vendor (fp32 matmuls ~2x faster on an AVX-512 AMD EPYC). No effect elsewhere; "
        "slime.runtime.mkl_vendor.",
    )


def finalize(args: argparse.Namespace) -> None:
    require_positive(args, "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine")
    args.actor_world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
    _data_parallel_size(args)
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = args.actor_world_size if args.colocate else args.rollout_num_gpus_per_engine
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        raise SlimeError(
            f"--rollout-num-gpus ({args.rollout_num_gpus}) must be a multiple of "
            f"--rollout-num-gpus-per-engine ({args.rollout_num_gpus_per_engine})"
        )
    args.num_engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    if args.colocate and args.actor_num_nodes > 1 and args.actor_num_gpus_per_node % args.rollout_num_gpus_per_engine:
        raise SlimeError(
            f"--colocate over --actor-num-nodes {args.actor_num_nodes}: an engine is one process on one node, but "
            f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine} does not divide "
            f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node}, so an engine's slots would span two nodes"
        )
    resolve_offload(args)


def _data_parallel_size(args: argparse.Namespace) -> None:
    """Megatron's rule: the training ranks are tensor-parallel groups of --tensor-model-parallel-size,
    each a data-parallel rank (the fsdp backend shards over every rank: each is data-parallel)."""
    tp = args.tensor_model_parallel_size if args.train_backend == "megatron" else 1
    if tp < 1 or args.actor_world_size % tp:
        raise SlimeError(
            f"--tensor-model-parallel-size {tp} must divide the training ranks ({args.actor_world_size}, from "
            f"--actor-num-nodes {args.actor_num_nodes} x --actor-num-gpus-per-node {args.actor_num_gpus_per_node})"
        )
    args.data_parallel_size = args.actor_world_size // tp


def resolve_offload(args: argparse.Namespace) -> None:
    """slime's rules: --offload sets both; --debug-rollout-only has no trainer to take turns with;
    --colocate offloads both sides unless --no-offload-* says otherwise; the PPO critic forces
    --offload-train. --release-train is Megatron's (slime refuses it with any other backend)."""
    if args.offload:
        args.offload_train = args.offload_rollout = True
    if args.release_train and args.train_backend == "megatron":
        raise SlimeError("--release-train: the megatron backend does not release its weights yet; leave it out")
    if args.release_train:
        raise SlimeError(
            "--release-train is only supported with the Megatron train backend (slime's rule); with --train-backend "
            "fsdp, --offload-train releases the optimizer state and gradients during rollout instead"
        )
    if args.debug_rollout_only:
        args.offload_train = args.offload_rollout = False
    elif args.colocate:
        if args.offload_train is None:
            args.offload_train = True
        if args.offload_rollout is None:
            args.offload_rollout = True
    args.offload_train = bool(args.offload_train) or args.advantage_estimator == "ppo"  # slime: critic => offload
    args.offload_rollout = bool(args.offload_rollout)
