"""Built-in reward models, selected by `--rm-type` (slime's `slime.rollout.rm_hub`).

`async_rm(args, sample)` returns one sample's reward; `batched_async_rm(args, samples)` a list.
With `--custom-rm-path` set, that function is used instead (slime's convention: called with one
sample by `async_rm`, with the whole list by `batched_async_rm`). A sample's
`metadata["rm_type"]` overrides `--rm-type` for that sample (mixed datasets).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

from slime.errors import SlimeError
from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_math, is_equiv, normalize_answer
from slime.utils.misc import load_function
from slime.utils.types import Sample


def _math_rm(args: Any, sample: Sample) -> float:
    return grade_math(sample.response, sample.label)


# name -> function(args, sample) -> float. Add a reward model here and it is known everywhere.
_RM_FUNCTIONS: dict[str, Callable[[Any, Sample], float]] = {
    "math": _math_rm,
}
RM_TYPES: tuple[str, ...] = tuple(_RM_FUNCTIONS)


def validate_rm_type(name: str | None) -> str:
    """Return `name` if it is a known reward model type; else raise naming --rm-type and the choices."""
    if name not in _RM_FUNCTIONS:
        raise SlimeError(
            f"--rm-type {name!r} is not a known reward model; known types: {', '.join(RM_TYPES)} "
            "(or set --custom-rm-path to your own function)"
        )
    return name


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _custom_rm(args: Any) -> Callable | None:
    path = getattr(args, "custom_rm_path", None)
    return load_function(path, arg_name="--custom-rm-path") if path else None


def _rm_type_of(args: Any, sample: Sample) -> str | None:
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = metadata.get("rm_type") or getattr(args, "rm_type", None)
    if isinstance(rm_type, str):
        rm_type = rm_type.strip()
    if not rm_type:
        raise SlimeError("no reward model: set --rm-type (one of: " + ", ".join(RM_TYPES) + ") or --custom-rm-path")
    return rm_type


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> float:
    """The reward of one sample."""
    custom = _custom_rm(args)
    if custom is not None:
        return await _maybe_await(custom(args, sample, **kwargs))
    rm_type = validate_rm_type(_rm_type_of(args, sample))
    return float(_RM_FUNCTIONS[rm_type](args, sample))


async def batched_async_rm(args: Any, samples: list[Sample], **kwargs: Any) -> list[float]:
    """Rewards of a list of samples (a custom reward function gets the whole list at once)."""
    custom = _custom_rm(args)
    if custom is not None:
        return list(await _maybe_await(custom(args, samples, **kwargs)))
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))


__all__ = [
    "RM_TYPES",
    "validate_rm_type",
    "async_rm",
    "batched_async_rm",
    "grade_math",
    "extract_boxed_answer",
    "normalize_answer",
    "is_equiv",
]
