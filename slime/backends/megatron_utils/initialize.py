"""Megatron's parallel state on the trainer's process group: tensor- and data-parallel groups over
gloo on a CPU (NCCL on GPUs), and Megatron's RNG tracker seeded without touching CUDA's RNG."""

from __future__ import annotations

import torch

from slime.backends.megatron_utils import cpu_support


def init_megatron(tensor_parallel: int, seed: int) -> list[str]:
    """Parallel groups (torch.distributed must be initialised) and seeds; the CPU substitutes
    installed (their names; none on a GPU)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    installed = cpu_support.apply()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)
    # the inference tracker keeps the RNG states on the CPU (Megatron's default one saves CUDA's)
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=not torch.cuda.is_available())
    return installed
