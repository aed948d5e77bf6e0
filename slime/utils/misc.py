"""Small helpers shared across the package (slime's `slime.utils.misc` names)."""

from __future__ import annotations

import base64
import importlib
import os
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
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


def exec_command(cmd: str, capture_output: bool = False) -> str | None:
    """slime's `exec_command`: run `cmd` with `bash -c`, echoing it first (`EXEC: ...`); a non-zero
    exit raises `subprocess.CalledProcessError`. With `capture_output` the output is printed and
    stdout returned as text; without, it goes to this process's own streams and None is returned."""
    print(f"EXEC: {cmd}", flush=True)
    try:
        done = subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output, text=capture_output)
    except subprocess.CalledProcessError as e:
        if capture_output:  # the failing command's output is the diagnosis
            print(f"e.stdout={e.stdout!r} e.stderr={e.stderr!r}", flush=True)
        raise
    if not capture_output:
        return None
    print(f"Captured stdout={done.stdout} stderr={done.stderr}", flush=True)
    return done.stdout


def get_current_node_ip() -> str:
    """slime's `get_current_node_ip`: this node's address as Ray knows it, without IPv6 brackets.

    Ray here binds its local cluster to 127.0.0.1, so inside a run that is loopback; with no Ray
    node in this process the address is `http_utils.get_host_info`'s (SLIME_HOST_IP, else loopback)
    rather than a guess at a LAN address that nothing here listens on."""
    try:
        import ray  # lazily: most helpers here must not load Ray
    except ImportError:
        ray = None
    if ray is not None and ray.is_initialized():
        return str(ray.util.get_node_ip_address()).strip("[]")
    from slime.utils.http_utils import get_host_info  # lazily: aiohttp is not needed by the rest

    return get_host_info()[1].strip("[]")


def get_free_port(start_port: int = 10000, consecutive: int = 1) -> int:
    """slime's `get_free_port`: the lowest port >= `start_port` such that it and the
    `consecutive - 1` ports above it can all be bound now (`http_utils.is_port_available`)."""
    from slime.utils.http_utils import is_port_available  # lazily: aiohttp is not needed by the rest

    port = start_port
    while not all(is_port_available(port + i) for i in range(consecutive)):
        port += 1
    return port


def chunk_named_params_by_size(named_params: Iterable[tuple[str, Any]], chunk_size: int) -> Iterator[list[Any]]:
    """slime's `chunk_named_params_by_size`: `(name, tensor)` pairs in order, yielded as lists
    whose tensors' bytes (`nbytes`) add up to less than `chunk_size`; a pair that would bring a
    non-empty list to `chunk_size` or more starts the next list (so one larger tensor goes alone)."""
    bucket: list[Any] = []
    filled = 0
    for pair in named_params:
        size = pair[1].nbytes
        if bucket and filled + size >= chunk_size:
            yield bucket
            bucket, filled = [], 0
        bucket.append(pair)
        filled += size
    if bucket:
        yield bucket


def argv_value(tokens: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a command line's tokens (`--flag v` or `--flag=v`), else None."""
    for i, tok in enumerate(tokens):
        if tok == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None
