"""megatron-core on a CPU: substitutes for the few places that hard-code CUDA, in one module.

megatron-core's model, tensor-parallel layers and collectives run on torch's CPU tensors and a gloo
process group, except where a function allocates on `torch.cuda.current_device()` or builds a
tensor with `device="cuda"`. The short ones a forward reaches get a substitute here that does the
same on the device of its inputs (`SUBSTITUTES`, installed by `apply()`); the training machinery,
where such allocations sit inside long functions, runs inside `cuda_calls_on_cpu()`, which makes
those tensors on the CPU. Both act only when torch sees no CUDA device: on a GPU none of this runs
and the code path is Megatron's own.

The substitutes are tied to the megatron-core release they were written against (`TESTED`):
another release stops at start-up with a message, since a moved or renamed function would
otherwise be patched silently in the wrong place. Each substitute has a test that leaves it out
and shows what fails (tests/backends/test_megatron_model.py).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from slime.errors import SlimeError

TESTED = "0.16.1"  # the megatron-core release these substitutes were written against


@dataclass(frozen=True)
class Substitute:
    name: str
    module: str  # where the attribute lives (a function imported by name is patched where it is used too)
    attr: str  # "func" or "Class.method"
    replacement: Callable[..., Any]
    why: str


def _rotary_embedding(self: Any, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """RoPE's angle table [s, 1, 1, dim] on the device `inv_freq` lives on (Megatron moves it to
    the current CUDA device at the first forward)."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [s, dim / 2]
    emb = freqs.repeat_interleave(2, dim=-1) if self.rotary_interleaved else torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :]


def _causal_mask(sq: int) -> torch.Tensor:
    """True above the diagonal: the positions a query may not attend to."""
    return torch.ones(sq, sq, dtype=torch.bool).triu(diagonal=1)


def _gather_along_last_dim(input_: torch.Tensor, group: Any) -> torch.Tensor:
    """Every tensor-parallel rank's slice, concatenated along the last dimension (vocab-parallel
    logits gathered whole), on the input's device."""
    world = group.size()
    if world == 1:
        return input_
    parts = [torch.empty_like(input_) for _ in range(world)]
    dist.all_gather(parts, input_.contiguous(), group=group)
    return torch.cat(parts, dim=-1).contiguous()


def _gather_along_first_dim(
    input_: torch.Tensor, group: Any, output_split_sizes: list[int] | None = None, use_global_buffer: bool = False
) -> torch.Tensor:
    """Every tensor-parallel rank's part concatenated along the first dimension (sequence-parallel
    activations gathered whole before a frozen model's linear layers), on the input's device."""
    world = group.size()
    if world == 1:
        return input_
    sizes = output_split_sizes or [input_.shape[0]] * world
    parts = [input_.new_empty((n, *input_.shape[1:])) for n in sizes]
    dist.all_gather(parts, input_.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter_along_first_dim(
    input_: torch.Tensor, group: Any, input_split_sizes: list[int] | None = None, use_global_buffer: bool = False
) -> torch.Tensor:
    """The sum over the tensor-parallel ranks, each keeping its part of the first dimension (an
    all-reduce, then the rank's slice: gloo has no reduce-scatter of a tensor)."""
    world = group.size()
    if world == 1:
        return input_
    if input_split_sizes is None:
        if input_.shape[0] % world:
            raise ValueError(f"first dimension {input_.shape[0]} is not divisible by the {world} tensor-parallel ranks")
        input_split_sizes = [input_.shape[0] // world] * world
    total = input_.contiguous().clone()
    dist.all_reduce(total, group=group)
    return total.split(input_split_sizes, dim=0)[group.rank()].contiguous()


def _get_all_rng_states() -> tuple[torch.Tensor, None, dict]:
    """The RNG states activation recomputation saves: the CPU's and Megatron's tracker's (there is
    no CUDA generator to save; restoring "none" is a CUDA call torch queues and never runs here)."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return torch.get_rng_state(), None, get_cuda_rng_tracker().get_states()


def _global_buffer_tensor(
    self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
) -> torch.Tensor:
    """Megatron's reusable scratch buffer (gathers of activations), kept on the CPU."""
    needed = 1
    for n in tensor_shape:
        needed *= int(n)
    key = (name, dtype)
    held = self.buffer.get(key)
    if held is None or held.numel() < needed:
        held = self.buffer[key] = torch.empty(needed, dtype=dtype, requires_grad=False)
    return held[:needed].view(*tensor_shape)


SUBSTITUTES: tuple[Substitute, ...] = (
    Substitute(
        "rotary_embedding",
        "megatron.core.models.common.embeddings.rotary_pos_embedding",
        "RotaryEmbedding.get_emb",
        _rotary_embedding,
        "moves inv_freq to torch.cuda.current_device() at the first forward",
    ),
    Substitute(
        "causal_mask",
        "megatron.core.fusions.fused_softmax",  # imported there by name from megatron.core.transformer.utils
        "get_default_causal_mask",
        _causal_mask,
        'the unfused softmax builds the causal attention mask with device="cuda"',
    ),
    Substitute(
        "gather_along_last_dim",
        "megatron.core.tensor_parallel.mappings",
        "_gather_along_last_dim",
        _gather_along_last_dim,
        "allocates the gathered tensor on torch.cuda.current_device()",
    ),
    Substitute(
        "gather_along_first_dim",
        "megatron.core.tensor_parallel.mappings",
        "_gather_along_first_dim",
        _gather_along_first_dim,
        "allocates the gathered tensor on torch.cuda.current_device() (--sequence-parallel, frozen weights)",
    ),
    Substitute(
        "reduce_scatter_along_first_dim",
        "megatron.core.tensor_parallel.mappings",
        "_reduce_scatter_along_first_dim",
        _reduce_scatter_along_first_dim,
        "allocates its output on torch.cuda.current_device() (--sequence-parallel)",
    ),
    Substitute(
        "get_all_rng_states",
        "megatron.core.tensor_parallel.random",
        "_get_all_rng_states",
        _get_all_rng_states,
        "saves the CUDA generator's state (activation recomputation, --recompute-granularity)",
    ),
    Substitute(
        "global_memory_buffer",
        "megatron.core.utils",
        "GlobalMemoryBuffer.get_tensor",
        _global_buffer_tensor,
        "allocates its buffers on torch.cuda.current_device()",
    ),
)

_originals: dict[str, Any] = {}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):  # torch.cuda.current_device()'s answer
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaCallsOnCpu(TorchFunctionMode):
    """Inside Megatron's training machinery: a tensor asked for on CUDA is made on the CPU, and a
    CPU tensor's `type()` answers as its CUDA twin (`torch.cuda.FloatTensor`), which Megatron's
    optimizer and gradient clipping assert."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if args[0].device.type == "cpu" else name
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_calls_on_cpu() -> Iterator[None]:
    """Megatron's training machinery (the DDP gradient buffers, the no-pipelining schedule, the
    optimizer, gradient norms and clipping) on the CPU: those allocate on CUDA inside long
    functions, which this runs unchanged. A no-op when torch sees a CUDA device."""
    if not needed():
        yield
        return
    current_device, synchronize = torch.cuda.current_device, torch.cuda.synchronize
    # the CPU itself as the "current device": tensors made there land on the CPU even where this mode
    # is not active (the backward of an autograd Function)
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    # checkpoint writes wait for their device-to-host copies; the CPU's copies are done when they return
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    try:
        with _CudaCallsOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = current_device, synchronize  # type: ignore[assignment]


def _owner_and_leaf(sub: Substitute) -> tuple[Any, str]:
    owner: Any = importlib.import_module(sub.module)
    *path, leaf = sub.attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, leaf


def check_version() -> str:
    """The installed megatron-core's version; another than `TESTED` stops with what to do."""
    try:
        import megatron.core
    except ImportError as e:
        raise SlimeError(
            f"--train-backend megatron needs megatron-core {TESTED}: pip install -c constraints.txt "
            f"'slime-rl[megatron]' ({e})"
        ) from e
    version = str(megatron.core.__version__)
    if version != TESTED:
        raise SlimeError(
            f"megatron-core {version} is installed; slime-rl's CPU support is tested with {TESTED} only "
            f"(slime/backends/megatron_utils/cpu_support.py patches its CUDA-only functions by name): install "
            f"megatron-core=={TESTED}"
        )
    return version


def needed() -> bool:
    return not torch.cuda.is_available()


def apply(skip: frozenset[str] = frozenset()) -> list[str]:
    """Install every substitute (but `skip`'s) when torch sees no CUDA device; the names installed."""
    if not needed():
        return []
    check_version()
    # every module imported before the first patch: one that imports a patched function by name
    # would otherwise take the substitute as Megatron's original
    targets = [(sub, *_owner_and_leaf(sub)) for sub in SUBSTITUTES if sub.name not in skip]
    for sub, owner, leaf in targets:
        _originals.setdefault(sub.name, getattr(owner, leaf))
    for sub, owner, leaf in targets:
        setattr(owner, leaf, sub.replacement)
    return [sub.name for sub, _, _ in targets]


def restore(names: frozenset[str] | None = None) -> None:
    """Megatron's own functions back, all or `names` (tests: what fails without a substitute)."""
    for sub in SUBSTITUTES:
        if sub.name in _originals and (names is None or sub.name in names):
            owner, leaf = _owner_and_leaf(sub)
            setattr(owner, leaf, _originals.pop(sub.name))
