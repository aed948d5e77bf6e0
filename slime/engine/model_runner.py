"""The model side of the built-in engine: load a local HF causal LM, run a batch of requests
(prefill rows into it, decode steps, rows leaving it) with a KV cache, and swap weights in place.

Two forward implementations share one batch interface (`new_batch`, `add_rows`, `decode`,
`select_rows`, `row_kv`): the engine's own for Llama-family models (`native_forward`, a slot KV
pool) and the model's HF forward for everything else (`hf_forward`). `--model-impl` picks one
(SGLang's flag: `auto`, `native` -- also `sglang` --, or `transformers`).

Only the scheduler's worker thread calls the batch methods and `load_named_tensors`, so
weights never change in the middle of a forward pass.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from slime.engine.args import MODEL_IMPLS, resolve_device
from slime.engine.hf_forward import HFForward
from slime.engine.native_forward import NativeForward, native_unsupported
from slime.engine.prefix_cache import PrefixCache
from slime.engine.weight_copy import copy_into
from slime.utils.accelerator import GIB, describe, free_memory_bytes, total_memory_bytes

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def column_major_linears(model) -> int:
    """Store each linear layer's weight column-major (the transposed matrix contiguous), in place.

    `F.linear(x, W)` computes `x @ W.T`; with the HF row-major `W`, MKL's kernels for 16-56 rows
    of `x` were measured here 2-5x slower than with `W.T` contiguous (the same values, only the
    memory order changes), and never faster at other sizes; the decode batch of an RL rollout
    passes through that range as its rows finish. Weights shared with the input embedding (tied
    heads) stay as they are: the embedding's row lookups need rows contiguous. Weight updates
    copy into these tensors, so they keep the layout. Returns how many weights moved."""
    embed = model.get_input_embeddings()
    shared = {embed.weight.data_ptr()} if embed is not None else set()
    moved = 0
    with torch.no_grad():
        for module in model.modules():
            w = getattr(module, "weight", None)
            if (
                isinstance(module, torch.nn.Linear)
                and w is not None
                and w.dim() == 2
                and w.data_ptr() not in shared
                and w.is_contiguous()
            ):
                w.data = w.data.t().contiguous().t()
                moved += 1
    return moved


class WeightUpdateError(ValueError):
    """A weight update that was rejected before anything changed (unknown name, wrong shape...)."""


class ModelRunner:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        context_length: int | None = None,
        tokenizer_path: str | None = None,
        trust_remote_code: bool = False,
        share_prefix: bool = True,
        prefix_cache_tokens: int = 0,
        model_impl: str = "auto",
        device: str | None = None,
    ):
        if model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}, got {model_impl!r}")
        # --device: CUDA when torch sees a GPU unless told; a CUDA device the machine lacks stops here
        self.device = resolve_device(device)
        self.share_prefix = share_prefix
        # KV of finished requests for later requests with the same prefix (multi-turn, resumed
        # partial samples); cleared whenever the weights change (weights_epoch)
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if share_prefix and prefix_cache_tokens > 0 else None
        self.weights_epoch = 0
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, trust_remote_code=trust_remote_code)
        config = AutoConfig.from_pretrained(self.model_path, trust_remote_code=trust_remote_code)
        if dtype == "auto":
            torch_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
            if isinstance(torch_dtype, str):
                torch_dtype = _DTYPES.get(torch_dtype, torch.float32)
            if torch_dtype == torch.float16:  # fp16 matmuls are slow and lossy on CPU
                torch_dtype = torch.bfloat16
        else:
            torch_dtype = _DTYPES[dtype]
        self.dtype = torch_dtype
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Any: transformers' stubs type the model so that .to(device) does not check
            self.model: Any = cast(
                Any,
                AutoModelForCausalLM.from_pretrained(
                    self.model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code
                ),
            )
        self.model.eval()
        self.model.requires_grad_(False)
        if self.on_gpu:
            self.model.to(self.device)
        else:  # an MKL layout trick; cuBLAS takes either layout
            column_major_linears(self.model)
        self.config = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        max_pos = getattr(self.config, "max_position_embeddings", None) or 32768
        self.context_length = int(min(context_length, max_pos) if context_length else max_pos)
        # a bound on any token's text (byte-level vocabularies spell one byte per character), so a
        # prompt text over context_length * max_token_chars characters cannot fit: refused untokenized
        self.max_token_chars = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = self.context_length * self.max_token_chars
        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(self.config, "pad_token_id", None)
        if pad is None or not 0 <= pad < self.vocab_size:
            pad = next(iter(self.eos_token_ids), 0)
        self.pad_token_id = int(pad)
        self._param_shapes = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        with self._on_device():
            self.forward, self.model_impl = self._pick_forward(model_impl)
        logger.info(
            "loaded %s: %d params, dtype %s, vocab %d, context %d, eos %s, forward %s, device %s",
            self.model_path,
            sum(p.numel() for p in self.model.parameters()),
            torch_dtype,
            self.vocab_size,
            self.context_length,
            sorted(self.eos_token_ids),
            self.model_impl,
            self.device,
        )

    # ------------------------------------------------------------------ device
    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def _on_device(self):
        """On a GPU, tensors the forwards create land there (torch's thread-local default
        device); on the CPU nothing changes."""
        return torch.device(self.device) if self.on_gpu else contextlib.nullcontext()

    def _to_host(self, t):
        return t.cpu() if self.on_gpu and t is not None else t

    def memory_bytes(self) -> int:
        """The memory --mem-fraction-static is a share of: the GPU's, or the machine's RAM."""
        return total_memory_bytes(self.device)

    def check_memory(self, option: str, wanted_bytes: float) -> None:
        """SystemExit naming `option` when weights + KV budget (`wanted_bytes`) is more than the
        GPU has (its total, and what other processes leave free of it)."""
        if not self.on_gpu:
            return
        total = self.memory_bytes()
        free = free_memory_bytes(self.device) + torch.cuda.memory_allocated(self.device)  # ours counts as free
        if wanted_bytes > min(total, free):
            raise SystemExit(
                f"{option} asks for {wanted_bytes / GIB:.2f} GiB of GPU memory (weights + KV cache) "
                f"but {describe(self.device)} has {free / GIB:.2f} GiB free of {total / GIB:.2f} GiB"
            )

    def _pick_forward(self, model_impl: str):
        """(forward, its name): the native one where it covers the model, unless told otherwise."""
        if model_impl != "transformers":
            reason = native_unsupported(self.model)
            if reason is None:
                if self.on_gpu:  # the torch path (the C kernels are CPU-only), KV in the model's dtype
                    fwd = NativeForward(self.model, self.dtype, self.context_length, use_kernels=False, widen=False)
                    fwd.kv_dtype = self.dtype
                    return fwd, "native"
                return NativeForward(self.model, self.dtype, self.context_length), "native"
            if model_impl in ("native", "sglang"):
                raise ValueError(f"--model-impl {model_impl}: the native forward does not cover this model: {reason}")
            logger.info("native forward not used (%s): running the model's HF forward", reason)
        return HFForward(self.model, self.pad_token_id), "transformers"

    # ------------------------------------------------------------------ helpers
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token takes: keys and values of every layer."""
        c = self.config
        layers = int(c.num_hidden_layers)
        heads = int(c.num_attention_heads)
        kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        kv_dtype = getattr(self.forward, "kv_dtype", self.dtype)
        return 2 * layers * kv_heads * head_dim * torch.finfo(kv_dtype).bits // 8

    def weight_bytes(self) -> int:
        """The model's parameters, plus the fp32 copies a widened bf16 forward multiplies (or the
        prepacked bf16 copies of one on a CPU with bf16 units)."""
        own = sum(p.numel() * p.element_size() for p in self.model.parameters())
        packed, wide = getattr(self.forward, "packed", None), getattr(self.forward, "wide", None)
        if packed is None and wide is None:
            return own
        copy_bytes = 4 if wide is not None else 2  # fp32 copies, or bf16 packed ones
        linear = [m.weight for m in self.model.modules() if isinstance(m, torch.nn.Linear)]
        return own + sum(w.numel() * copy_bytes for w in linear)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        candidates = [self.tokenizer.eos_token_id, getattr(self.config, "eos_token_id", None)]
        gen = getattr(self.model, "generation_config", None)
        if gen is not None:
            candidates.append(getattr(gen, "eos_token_id", None))
        for c in candidates:
            if c is None:
                continue
            for t in c if isinstance(c, (list, tuple)) else [c]:
                if isinstance(t, int) and 0 <= t < self.vocab_size:
                    ids.add(t)
        return ids

    # ------------------------------------------------------------------ batch
    def new_batch(self):
        with self._on_device():
            return self.forward.new_batch()

    def add_rows(self, batch, prompts: list[list[int]], max_new: int, full_logits: bool = False):
        """Prefill `prompts` and append them as rows of `batch` (a running batch or a new one).

        Returns (last-position logits [n, V] fp32, per-row prompt logits [len(prompt), V] fp32
        or None, per-row prompt tokens whose KV was reused), or None when the batch cannot take
        rows (an HF cache type that cannot be merged; nothing changed).

        Prefix sharing (SGLang's radix-cache idea, for exactly repeated prompts): the `n`
        samples of one prompt are prefilled once and their KV copied, so a GRPO group costs one
        prompt's prefill. Across requests, a prompt that starts with the tokens of an earlier
        request takes their KV from the prefix cache and prefills only the rest (not when
        prompt logits are asked for: those need every position).
        """
        hits = {}
        if self.prefix_cache is not None and len(self.prefix_cache) and not full_logits:
            for j, p in enumerate(prompts):
                m, entry = self.prefix_cache.match(p)
                if entry is not None:
                    hits[j] = (m, entry)
        if not self.on_gpu:
            return self.forward.add_rows(batch, prompts, max_new, full_logits, hits, self.share_prefix)
        with self._on_device():
            out = self.forward.add_rows(batch, prompts, max_new, full_logits, hits, self.share_prefix)
        if out is None:
            return None
        last, full, cached = out  # the scheduler samples on the host
        return self._to_host(last), None if full is None else [self._to_host(f) for f in full], cached

    def decode(self, batch, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: feed `tokens` [B] and return next logits [B, V] fp32."""
        if not self.on_gpu:
            return self.forward.decode(batch, tokens)
        with self._on_device():
            return self._to_host(self.forward.decode(batch, tokens.to(self.device)))

    def select_rows(self, batch, keep: list[int]) -> None:
        """Rows `keep[i]` become rows i; the others leave the batch."""
        with self._on_device():
            self.forward.select_rows(batch, keep)

    @torch.inference_mode()
    def remember(self, batch, row: int, tokens: list[int]) -> None:
        """Keep the KV of a row leaving the batch in the prefix cache. `tokens` are the row's
        tokens whose KV is in the cache."""
        if self.prefix_cache is None or len(tokens) < self.prefix_cache.min_match:
            return
        with self._on_device():
            kv = self.forward.row_kv(batch, row, len(tokens))
        if kv is not None:
            self.prefix_cache.insert(list(tokens), *kv)

    def clear_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # ------------------------------------------------------------------ weights
    def validate_named_tensors(self, named: dict[str, torch.Tensor]) -> None:
        if not named:
            raise WeightUpdateError("no tensors in the update")
        unknown = [n for n in named if n not in self._param_shapes]
        if unknown:
            raise WeightUpdateError(
                f"unknown parameter name(s) {unknown[:5]}{' ...' if len(unknown) > 5 else ''}; "
                f"expected HF state-dict names such as {next(iter(self._param_shapes))!r}"
            )
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                raise WeightUpdateError(f"{n!r} is not a tensor")
            if tuple(t.shape) != self._param_shapes[n]:
                raise WeightUpdateError(
                    f"shape mismatch for {n!r}: got {tuple(t.shape)}, model has {self._param_shapes[n]}"
                )
            if not (t.is_floating_point() or t.dtype == self.model.state_dict()[n].dtype):
                raise WeightUpdateError(f"{n!r} has dtype {t.dtype}, expected a floating-point tensor")

    @torch.inference_mode()
    def load_named_tensors(self, named: dict[str, torch.Tensor]) -> int:
        """Copy validated tensors into the model in place (tied weights share storage, so an
        update through either name keeps them consistent). Returns the number of tensors."""
        self.validate_named_tensors(named)
        state = self.model.state_dict()
        self.weights_epoch += 1  # KV computed before this is stale: never reused
        self.clear_prefix_cache()
        for n, t in named.items():
            copy_into(state[n], t)  # the column-major linears: a transposing copy, in C for fp32
        if self.on_gpu:  # the sender may free or change its tensors (CUDA IPC) once this returns
            torch.cuda.synchronize(self.device)
        return len(named)

    @staticmethod
    def read_safetensors_dir(path: str, file_ok: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
        """The tensors of a safetensors file or directory (through its index, if it has one). An
        index names files inside the directory (no absolute path, no `..`); with `file_ok`, every
        file, symlinks resolved, must pass it, or nothing is read (the message never says whether
        a file elsewhere exists)."""
        p = Path(path)
        if p.is_file():
            files = [str(p)]
        else:
            if not p.is_dir():
                raise WeightUpdateError(f"model_path {path!r} is not a directory")
            index = p / "model.safetensors.index.json"
            if index.exists():
                weight_map = json.loads(index.read_text())["weight_map"]
                names = sorted(set(weight_map.values()))
                for name in names:
                    if not isinstance(name, str) or os.path.isabs(name) or ".." in Path(name).parts:
                        raise WeightUpdateError(f"{index.name} names {name!r}, not a file inside the directory")
                files = [str(p / name) for name in names]
            else:
                files = sorted(glob.glob(str(p / "*.safetensors")))
        for f in files:
            if file_ok is not None and not file_ok(f):
                raise WeightUpdateError(f"{os.path.basename(f)!r} leads outside the directories weights load from")
        if not files:
            raise WeightUpdateError(f"no *.safetensors files in {path!r}")
        named: dict[str, torch.Tensor] = {}
        for f in files:
            named.update(load_file(f))
        return named
