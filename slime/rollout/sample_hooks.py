"""slime's `slime.rollout.sample_hooks`: the `--rollout-sample-hook-path` hooks, applied to each
generated Sample before its reward.

A hook is `hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`, sync or
async; it is passed only the keywords its signature takes. None keeps the sample (changed in
place or not), a Sample replaces it, anything else is an error. The rollout id is the one the
rollout manager set last (`set_current_rollout_id`, module-wide as in slime).

`apply_rollout_sample_hooks` raises on a failing hook, as slime's does; the default rollout
(`slime.rollout.sglang_rollout`) applies the same hooks one by one and marks a sample whose hook
fails FAILED instead, so one bad sample does not stop the rollout.
"""

from __future__ import annotations

import inspect
from argparse import Namespace
from collections.abc import Callable
from typing import Any

from slime.utils.misc import load_function
from slime.utils.types import Sample

_current_rollout_id: int | None = None


def set_current_rollout_id(rollout_id: int | None) -> None:
    """Set by the rollout manager before each rollout and evaluation."""
    global _current_rollout_id
    _current_rollout_id = rollout_id


def current_rollout_id() -> int | None:
    return _current_rollout_id


def accepted_kwargs(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn` takes (all of them with **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin: nothing to read
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


async def apply_hook(args: Namespace, sample: Sample, path: str, **kwargs: Any) -> Sample:
    """One hook on one sample: the sample to go on with."""
    hook = load_function(path, arg_name="--rollout-sample-hook-path")
    result = hook(args, sample, **accepted_kwargs(hook, kwargs))
    if inspect.isawaitable(result):
        result = await result
    if result is not None and not isinstance(result, Sample):
        raise TypeError(f"--rollout-sample-hook-path {path} returned {type(result).__name__}, not a Sample or None")
    return sample if result is None else result


async def apply_rollout_sample_hooks(args: Namespace, value: Sample | list, **kwargs: Any) -> Sample | list:
    """Every hook, in order, on every Sample of `value` (a Sample or nested lists of them, whose
    shape is kept)."""
    paths = args.rollout_sample_hook_path or []
    if not paths:
        return value
    kwargs.setdefault("rollout_id", _current_rollout_id)
    if isinstance(value, Sample):
        for path in paths:
            value = await apply_hook(args, value, path, **kwargs)
        return value
    if isinstance(value, list):
        return [await apply_rollout_sample_hooks(args, item, **kwargs) for item in value]
    raise TypeError(f"rollout sample hooks take a Sample or a list, got {type(value).__name__}")
