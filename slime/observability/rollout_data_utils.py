"""slime's `slime.observability.rollout_data_utils`: rollout data made ready for training (CPU
tensors), checks of what a rollout function returned, and the debug rollout dumps.

The dumps are those of `slime.observability.debug_data` (`{"rollout_id", "samples":
[Sample.to_dict(), ...]}`, `torch.save`); loading reads plain types only and names the file when it
is not such a dump.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slime.observability.debug_data import read_samples
from slime.utils.types import Sample

__all__ = [
    "tensorize_rollout_data_for_training",
    "validate_rollout_routed_experts_for_replay",
    "validate_rollout_id_annotated",
    "load_debug_rollout_data",
    "save_debug_rollout_data",
]

logger = logging.getLogger(__name__)

# per-sample fields turned into tensors, and their dtype (None: as given)
_TENSOR_DTYPES: dict[str, torch.dtype | None] = {
    "tokens": torch.long,
    "loss_masks": torch.int,
    "rollout_log_probs": torch.float32,
    "rollout_top_p_token_ids": torch.int32,
    "rollout_top_p_token_offsets": torch.int32,
    "teacher_log_probs": torch.float32,
    "rollout_routed_experts": None,
}


def _cpu_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()  # torch cannot wrap a read-only array
    tensor = torch.as_tensor(value, dtype=dtype) if dtype is not None else torch.as_tensor(value)
    return tensor.detach().cpu().contiguous()


def tensorize_rollout_data_for_training(rollout_data: dict[str, Any]) -> None:
    """In place: each per-sample list of `_TENSOR_DTYPES` becomes a list of contiguous CPU
    tensors; array values of `multimodal_train_inputs` become tensors; `rollout_mask_sums` a
    float32 tensor."""
    for key, dtype in _TENSOR_DTYPES.items():
        if key in rollout_data:
            rollout_data[key] = [_cpu_tensor(v, dtype=dtype) for v in rollout_data[key]]
    if "multimodal_train_inputs" in rollout_data:
        rollout_data["multimodal_train_inputs"] = [
            None
            if mm is None
            else {k: _cpu_tensor(v) if isinstance(v, (np.ndarray, torch.Tensor)) else v for k, v in mm.items()}
            for mm in rollout_data["multimodal_train_inputs"]
        ]
    if "rollout_mask_sums" in rollout_data:
        rollout_data["rollout_mask_sums"] = _cpu_tensor(rollout_data["rollout_mask_sums"], dtype=torch.float32)


def validate_rollout_routed_experts_for_replay(routed_experts: list[torch.Tensor], args: Namespace) -> None:
    """Routing replay (R3) needs each sample's routed experts as `[tokens, --num-layers,
    --moe-router-topk]`, with some routing recorded on every MoE layer; ValueError otherwise."""
    if not routed_experts:
        raise ValueError("R3 is enabled but no rollout routed-experts tensors were returned.")
    num_layers, topk = int(args.num_layers), int(args.moe_router_topk)
    freq = args.moe_layer_freq
    if isinstance(freq, (list, tuple)):
        moe_layers = [i for i, f in enumerate(freq[:num_layers]) if int(f) != 0]
    else:
        moe_layers = list(range(num_layers))
    for i, experts in enumerate(routed_experts):
        experts = torch.as_tensor(experts)
        if experts.ndim != 3 or tuple(experts.shape[1:]) != (num_layers, topk):
            raise ValueError(
                f"Invalid rollout routed-experts shape for R3: sample={i}, got={tuple(experts.shape)}, "
                f"expected=(*, {num_layers}, {topk})."
            )
        if experts.shape[0] == 0:
            raise ValueError(f"R3 sample {i} has no routed-experts rows.")
        if topk > 1:
            # all-zero routing on a layer means the capture of that pipeline stage never arrived
            missing = [layer for layer in moe_layers if not torch.count_nonzero(experts[:, layer, :])]
            if missing:
                raise ValueError(
                    f"R3 routed-experts capture is all zero for MoE layers {missing} in sample {i}: the "
                    "engine's pipeline stages did not combine their routing captures."
                )


def validate_rollout_id_annotated(node: Any, depth: int = 0) -> None:
    """A rollout function's output nested deeper than `list[list[Sample]]` (several training
    samples from one rollout, e.g. an agent's turns) must give the siblings one shared, set
    `Sample.rollout_id`, so the loss counts that rollout once; AssertionError otherwise."""
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected rollout output node type: {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [s.rollout_id for s in node]
            unset = [i for i, rid in enumerate(ids) if rid is None]
            assert not unset, (
                f"Compact rollout returned {len(node)} samples but rollout_id is unset on positions {unset}. "
                "Set Sample.rollout_id on every sibling so the loss counts them as one rollout."
            )
            assert len(set(ids)) == 1, f"Sibling samples from one compact rollout must share rollout_id; got {ids}."
        return
    for item in node:
        validate_rollout_id_annotated(item, depth + 1)


def load_debug_rollout_data(
    path_template: str, *, rollout_id: int, subsample_ratio: float | None = None
) -> list[Sample]:
    """The samples of `path_template.format(rollout_id=...)`; with `subsample_ratio`, the first
    and last halves of `int(n * ratio)` of them."""
    samples = read_samples(Path(path_template.format(rollout_id=rollout_id)), rollout_id)
    if subsample_ratio is not None:
        n = len(samples)
        k = int(n * subsample_ratio)
        samples = samples[: k // 2] + samples[-k // 2 :] if k else []
        logger.info("Subsampled debug rollout data with ratio=%s: %s -> %s rows", subsample_ratio, n, len(samples))
    return samples


def save_debug_rollout_data(path_template: str | None, data: Any, *, rollout_id: int, evaluation: bool) -> None:
    """Save a rollout's samples (evaluation: `{name: {"samples": [...]}}`, file id `eval_<id>`)
    to `path_template.format(rollout_id=...)`; nothing without a template."""
    if path_template is None:
        return
    path = Path(path_template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if evaluation:
        records = [s.to_dict() for info in data.values() for s in info["samples"]]
    else:
        records = [s.to_dict() for s in data]
    logger.info("Save debug rollout data to %s", path)
    torch.save({"rollout_id": rollout_id, "samples": records}, path)
