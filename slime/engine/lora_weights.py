"""Adapter-only weight updates: the engine keeps the base weights of a LoRA run's adapted modules
and merges each adapter it receives into its working copy, W = W0 + scale·B·A
(`slime.utils.lora_merge`, the trainer's own merge), so decoding runs a plain model.

An update that carries a LoRA adapter has a `lora` field in its control body:

    {"scaling": alpha / r, "base_id": "<the trainer's id of its base>", "base": true|false,
     "modules": ["model.layers.0.self_attn.q_proj", ...]}

and tensors named `<module>.lora_A.weight` [r, in] and `<module>.lora_B.weight` [out, r] for
every listed module. With `base: true` it also carries `<module>.weight` (the base W0) of every
listed module, which the engine keeps (and does not load as it is); any other tensor loads as in
a plain update. Without the base, the engine must hold the base of `base_id` already: otherwise
the update is refused (HTTP 409) and the trainer sends the base. A bucketed update may split a
module's tensors over several calls: a module is merged once its base, A and B have all arrived,
and the call that closes the update (the one with a `weight_version`) must leave none pending.

Any update without a `lora` field replaces weights wholesale (a full sync, a snapshot loaded
after a restart): the kept base is dropped with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from slime.utils.lora_merge import check_shapes, merge_weight, one_thread

A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"


class LoraUpdateError(ValueError):
    """The update does not fit (400)."""


class LoraBaseMissing(LoraUpdateError):
    """The engine holds no base for this adapter (409: send the base)."""


@dataclass
class LoraRequest:
    scaling: float
    base_id: str
    with_base: bool
    modules: list[str]

    @classmethod
    def parse(cls, body: dict) -> LoraRequest | None:
        raw = body.get("lora")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise LoraUpdateError(f"lora must be an object, got {type(raw).__name__}")
        scaling, base_id, with_base, modules = (raw.get(k) for k in ("scaling", "base_id", "base", "modules"))
        if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not math.isfinite(scaling):
            raise LoraUpdateError(f"lora.scaling must be a finite number, got {scaling!r}")
        if not isinstance(base_id, str) or not base_id:
            raise LoraUpdateError(f"lora.base_id must be a non-empty string, got {base_id!r}")
        if not isinstance(with_base, bool):
            raise LoraUpdateError(f"lora.base must be true or false, got {with_base!r}")
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
            raise LoraUpdateError("lora.modules must be a non-empty list of module names")
        return cls(float(scaling), base_id, with_base, list(modules))


@dataclass
class LoraBase:
    """The base weights an engine keeps for adapter-only updates, and the pieces of a bucketed
    update still waiting for the rest of their module."""

    base_id: str | None = None
    base: dict[str, torch.Tensor] = field(default_factory=dict)  # module -> W0
    pending: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # module -> {"A"|"B": tensor}
    incoming_id: str | None = None  # a base being received (bucketed), not yet complete
    merged: set[str] = field(default_factory=set)  # modules merged so far in this update

    def clear(self) -> None:
        self.base_id, self.incoming_id = None, None
        self.base.clear()
        self.pending.clear()
        self.merged.clear()

    def expand(self, named: dict[str, torch.Tensor], req: LoraRequest, closing: bool) -> dict[str, torch.Tensor]:
        """The plain weights to load for this call of an adapter update: every other tensor as it
        came, and the merged weight of each module whose base, A and B are all here now."""
        modules = set(req.modules)
        if req.with_base and self.incoming_id != req.base_id:  # a new base starts arriving
            self.clear()
            self.incoming_id = req.base_id
        elif not req.with_base and self.base_id != req.base_id:
            raise LoraBaseMissing(
                f"this engine holds no base weights for adapter base {req.base_id!r} "
                f"({'it holds ' + repr(self.base_id) if self.base_id else 'it holds none'}): send them with lora.base"
            )
        plain: dict[str, torch.Tensor] = {}
        for name, t in named.items():
            for suffix, key in ((A_SUFFIX, "A"), (B_SUFFIX, "B")):
                if name.endswith(suffix):
                    module = name[: -len(suffix)]
                    if module not in modules:
                        raise LoraUpdateError(f"{name}: module {module!r} is not in lora.modules")
                    self.pending.setdefault(module, {})[key] = t.clone()  # the sender may reuse its buffer
                    break
            else:
                owner = name[: -len(".weight")] if name.endswith(".weight") else None
                if req.with_base and owner in modules:
                    self.base[owner] = t.detach().clone()
                else:
                    plain[name] = t
        ready = [m for m, parts in self.pending.items() if len(parts) == 2 and m in self.base]
        for module in ready:
            parts, w0 = self.pending[module], self.base[module]
            problem = check_shapes(module, w0.shape, parts["A"].shape, parts["B"].shape)
            if problem:
                self.clear()
                raise LoraUpdateError(problem)
        with one_thread():
            for module in ready:
                parts = self.pending.pop(module)
                plain[f"{module}.weight"] = merge_weight(self.base[module], parts["A"], parts["B"], req.scaling)
                self.merged.add(module)
        if closing:
            missing = sorted(modules - self.merged)
            self.merged.clear()
            if self.pending or missing:
                left = sorted(self.pending) or missing
                self.clear()
                raise LoraUpdateError(
                    f"the adapter update ended with {len(left)} module(s) incomplete (base, A and B each "
                    f"needed), e.g. {left[0]!r}"
                )
            if req.with_base:
                self.base_id, self.incoming_id = req.base_id, None
        return plain
