"""Small helpers shared across the package (slime's `slime.utils.misc` names)."""

from __future__ import annotations

import base64
import importlib
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from slime.errors import SlimeError

# Models and tokenizers are local directories: nothing is fetched from a hub. huggingface_hub reads
# these once, at its own import, so each process gets them where it starts (`set_hub_env` before it
# imports transformers, or in the environment it is started with), never from importing slime.
HUB_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def set_hub_env() -> None:
    """At a process's start: `HUB_ENV` into its environment, values the user set kept."""
    for key, value in HUB_ENV.items():
        os.environ.setdefault(key, value)


def load_function(path: str, *, arg_name: str | None = None) -> Callable[..., Any]:
    """Load `pkg.module.attr` (slime's `load_function`).

    `arg_name` names the command-line argument the path came from, so an import error
    points the user at what to fix.
    """
    where = f" (from {arg_name})" if arg_name else ""
    module_path, _, attr = path.rpartition(".")
    if not module_path:
        raise SlimeError(f"{path!r}{where} is not a dotted path of the form 'package.module.function'")
    try:
        module = importlib.import_module(module_path)
    except Exception as e:  # ImportError, or an error while the module runs
        raise SlimeError(f"cannot import module {module_path!r}{where}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SlimeError(f"module {module_path!r} has no attribute {attr!r}{where}") from None


class SingletonMeta(type):
    """Metaclass: the first `Cls(...)` builds the one instance, later calls return it (their
    arguments are ignored). `Cls.clear_instances()` forgets it, so the next call builds anew."""

    _instances: dict[type, Any] = {}
    _lock = threading.RLock()  # a hook's thread and the rollout may both ask first; re-entrant for
    # a singleton whose __init__ builds another

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        with SingletonMeta._lock:
            if cls not in cls._instances:
                cls._instances[cls] = super().__call__(*args, **kwargs)
            return cls._instances[cls]

    def clear_instances(cls) -> None:
        # a fresh registry on this class shadows the shared one, as slime's does
        cls._instances = {}


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]) -> Any:
    """The first of `keys` present in an engine's `meta_info`, as a flat int32 tensor (None if
    absent or null). The value may be base64 of raw int32 bytes, bytes, a tensor or a list."""
    import torch  # lazily: the engine-free ground must not pay for torch

    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return torch.frombuffer(bytearray(value), dtype=torch.int32)
    if torch.is_tensor(value):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)


def should_run_periodic_action(
    rollout_id: int, interval: int | None, num_rollout_per_epoch: int | None = None, num_rollout: int | None = None
) -> bool:
    """Whether a periodic action (eval, save) runs after rollout `rollout_id` (0-based): every
    `interval` rollouts, at each epoch end, and at the last rollout; never if `interval` is None."""
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    step = rollout_id + 1
    return step % interval == 0 or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


class Box:
    """A read-only holder (keeps an object from being copied or unpacked on its way through Ray)."""

    def __init__(self, inner: Any):
        self._inner = inner

    @property
    def inner(self) -> Any:
        return self._inner


def group_by(iterable: Iterable[Any], key: Callable[[Any], Any] | None = None) -> dict[Any, list[Any]]:
    """Items grouped by `key(item)` (the item itself without a key), in first-seen order; unlike
    itertools.groupby the input need not be sorted."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for item in iterable:
        groups[key(item) if key is not None else item].append(item)
    return dict(groups)
