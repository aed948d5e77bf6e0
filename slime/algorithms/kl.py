"""Per-token KL estimators between the policy and a reference policy (Schulman, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html), as slime's ``--kl-loss-type``.

With ``log_ratio = log_probs - ref_log_probs`` (tokens sampled from the policy):

* ``k1``: ``log_ratio`` (unbiased, high variance, can be negative);
* ``k2``: ``0.5 * log_ratio ** 2`` (biased, low variance);
* ``k3``: ``exp(-log_ratio) - 1 + log_ratio`` (unbiased, >= 0, low variance);
* ``low_var_kl``: ``k3`` clamped to ``[-10, 10]`` (slime and verl clamp only this one).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KL_TYPES", "compute_approx_kl"]

KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")


def compute_approx_kl(
    log_probs: Tensor, ref_log_probs: Tensor, kl_loss_type: str, importance_ratio: Tensor | None = None
) -> Tensor:
    """Per-token KL estimate of ``KL(pi || pi_ref)``, computed in float32 (float64 if given).

    See the module docstring for the formula of each ``kl_loss_type`` in :data:`KL_TYPES`.
    ``importance_ratio`` (``--use-unbiased-kl``, DeepSeek-V3.2): the estimate is multiplied by
    ``pi_theta / pi_old`` so it stays unbiased for samples drawn from the old policy (before the
    ``low_var_kl`` clamp, as slime).
    """
    if kl_loss_type not in KL_TYPES:
        raise ValueError(f"unknown kl_loss_type {kl_loss_type!r}; valid types: {', '.join(KL_TYPES)}")
    dtype = torch.promote_types(torch.promote_types(log_probs.dtype, ref_log_probs.dtype), torch.float32)
    log_ratio = log_probs.to(dtype) - ref_log_probs.to(dtype)
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = 0.5 * log_ratio.square()
    else:
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
    if importance_ratio is not None:
        kl = importance_ratio.to(kl.dtype) * kl
    if kl_loss_type == "low_var_kl":
        kl = kl.clamp(min=-10.0, max=10.0)
    return kl
