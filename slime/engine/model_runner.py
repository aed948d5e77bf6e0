"""The model side of the built-in engine: load a local HF causal LM, run batched prefill and
decode steps with a KV cache, and swap weights in place.

Only the scheduler's worker thread calls `prefill` / `decode` / `load_named_tensors`, so
weights never change in the middle of a forward pass.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from slime.engine.kv_cache import is_plain_layer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


class WeightUpdateError(ValueError):
    """A weight update that was rejected before anything changed (unknown name, wrong shape...)."""


@dataclass
class DecodeState:
    """KV cache and bookkeeping of a running batch (rows are left-padded)."""

    cache: object
    mask: torch.Tensor  # [B, capacity] long, 1 = real token; only [:, :length] is in use
    length: int  # columns in use (= cache sequence length)
    next_pos: torch.Tensor  # [B, 1] long: position id of the next token per row
    shared: list[bool] = field(default_factory=list)  # row's prefill was shared with an earlier row
    cached: list[int] = field(default_factory=list)  # prompt tokens per row whose KV was reused


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
    ):
        self.share_prefix = share_prefix
        # KV of finished requests for later requests with the same prefix (multi-turn, resumed
        # partial samples); cleared whenever the weights change (weights_epoch)
        from slime.engine.prefix_cache import PrefixCache

        self.prefix_cache = PrefixCache(prefix_cache_tokens) if share_prefix and prefix_cache_tokens > 0 else None
        self.weights_epoch = 0
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

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
            self.model = AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code
            )
        self.model.eval()
        self.model.requires_grad_(False)
        self.config = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        max_pos = getattr(self.config, "max_position_embeddings", None) or 32768
        self.context_length = int(min(context_length, max_pos) if context_length else max_pos)
        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(self.config, "pad_token_id", None)
        if pad is None or not 0 <= pad < self.vocab_size:
            pad = next(iter(self.eos_token_ids), 0)
        self.pad_token_id = int(pad)
        self._param_shapes = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        self._use_cache_kwarg = "cache"  # transformers >= 5.2x renamed past_key_values -> cache
        self._probe_cache_kwarg()
        logger.info(
            "loaded %s: %d params, dtype %s, vocab %d, context %d, eos %s",
            self.model_path, sum(p.numel() for p in self.model.parameters()), torch_dtype,
            self.vocab_size, self.context_length, sorted(self.eos_token_ids),
        )

    # ------------------------------------------------------------------ helpers
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token takes: keys and values of every layer."""
        c = self.config
        layers = int(getattr(c, "num_hidden_layers"))
        heads = int(getattr(c, "num_attention_heads"))
        kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        return 2 * layers * kv_heads * head_dim * torch.finfo(self.dtype).bits // 8

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

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

    def _probe_cache_kwarg(self) -> None:
        import inspect

        params = inspect.signature(self.model.forward).parameters
        if "cache" not in params:
            self._use_cache_kwarg = "past_key_values"

    def _new_cache(self):
        from transformers import DynamicCache

        from slime.engine.kv_cache import use_growable_layers

        try:
            cache = DynamicCache(config=self.config)
        except TypeError:
            cache = DynamicCache()
        use_growable_layers(cache)  # decode appends in place instead of copying the cache
        return cache

    def _forward(self, input_ids, attention_mask, position_ids, cache, logits_to_keep: int):
        kwargs = {self._use_cache_kwarg: cache}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        return out.logits

    # ------------------------------------------------------------------ compute
    @torch.inference_mode()
    def prefill(
        self, prompts: list[list[int]], max_new: int, full_logits: bool = False, use_cache: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, DecodeState]:
        """Left-padded prefill of `prompts`.

        Returns (last-position logits [B, V] fp32, all logits [B, L, V] fp32 or None, state).
        In the all-logits tensor row b's prompt occupies columns L - len(prompts[b]) .. L - 1.

        Prefix sharing (SGLang's radix-cache idea, for exactly repeated prompts): the `n`
        samples of one prompt are prefilled once and their KV rows copied, so a GRPO group
        costs one prompt's prefill. `state.shared[b]` says whether row b reused another's.
        Across requests, a prompt that starts with the tokens of an earlier request takes their
        KV from the prefix cache and prefills only the rest; `state.cached[b]` counts the
        prompt tokens row b did not prefill.
        """
        if use_cache and self.prefix_cache is not None and len(self.prefix_cache) and not full_logits:
            hits = {}
            for i, p in enumerate(prompts):
                m, entry = self.prefix_cache.match(p)
                if entry is not None:
                    hits[i] = (m, entry)
            if hits:
                return self._prefill_with_hits(prompts, max_new, hits)
        unique: dict[tuple[int, ...], int] = {}
        src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        if self.share_prefix and len(unique) < len(prompts):
            last, all_logits, state = self._prefill([list(p) for p in unique], max_new, full_logits)
            idx = torch.tensor(src, dtype=torch.long)
            state.cache.batch_select_indices(idx)  # repeated indices copy the shared rows
            state.mask = state.mask.index_select(0, idx)
            state.next_pos = state.next_pos.index_select(0, idx)
            first_row = {u: src.index(u) for u in set(src)}
            state.shared = [first_row[u] != row for row, u in enumerate(src)]
            state.cached = [len(p) if sh else 0 for p, sh in zip(prompts, state.shared)]
            return last.index_select(0, idx), (None if all_logits is None else all_logits.index_select(0, idx)), state
        return self._prefill(prompts, max_new, full_logits)

    def _prefill(
        self, prompts: list[list[int]], max_new: int, full_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, DecodeState]:
        b = len(prompts)
        max_len = max(len(p) for p in prompts)
        capacity = max_len + max(max_new, 0) + 1
        ids = torch.full((b, max_len), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, capacity), dtype=torch.long)
        for i, p in enumerate(prompts):
            n = len(p)
            ids[i, max_len - n:] = torch.tensor(p, dtype=torch.long)
            mask[i, max_len - n:max_len] = 1
        used = mask[:, :max_len]
        pos = (used.cumsum(-1) - 1).clamp_min_(0)
        cache = self._new_cache()
        logits = self._forward(ids, used, pos, cache, 0 if full_logits else 1)
        all_logits = logits.float() if full_logits else None
        last = logits[:, -1].float()
        lengths = torch.tensor([[len(p)] for p in prompts], dtype=torch.long)
        return last, all_logits, DecodeState(cache=cache, mask=mask, length=max_len, next_pos=lengths,
                                             shared=[False] * b, cached=[0] * b)

    def _prefill_with_hits(self, prompts: list[list[int]], max_new: int, hits: dict) -> tuple:
        """Rows without a prefix-cache hit in one batched prefill, each hit on its own cache,
        merged into one batch in the original row order."""
        order = [i for i in range(len(prompts)) if i not in hits]
        lasts, state = [], None
        if order:
            last, _, state = self.prefill([prompts[i] for i in order], max_new, False, use_cache=False)
            lasts.append(last)
        for i, (m, entry) in hits.items():
            last, other = self._prefill_from_entry(prompts[i], m, entry, max_new)
            if state is None:
                state = other
            elif not self.merge(state, other):  # a cache type merge cannot pad: no reuse then
                return self.prefill(prompts, max_new, False, use_cache=False)
            lasts.append(last)
            order.append(i)
        idx = torch.tensor([order.index(i) for i in range(len(prompts))], dtype=torch.long)
        state.cache.batch_select_indices(idx)
        state.mask = state.mask.index_select(0, idx)
        state.next_pos = state.next_pos.index_select(0, idx)
        state.shared = [state.shared[j] for j in idx.tolist()]
        state.cached = [state.cached[j] for j in idx.tolist()]
        return torch.cat(lasts, dim=0).index_select(0, idx), None, state

    def _prefill_from_entry(self, prompt: list[int], m: int, entry, max_new: int) -> tuple:
        """Prefill `prompt[m:]` on top of the cached KV of `prompt[:m]` (one row)."""
        cache = self._new_cache()
        for layer, (k, v) in enumerate(zip(entry.keys, entry.values)):
            cache.update(k[:, :m].unsqueeze(0), v[:, :m].unsqueeze(0), layer)
        n = len(prompt)
        mask = torch.zeros((1, n + max(max_new, 0) + 1), dtype=torch.long)
        mask[0, :n] = 1
        ids = torch.tensor([prompt[m:]], dtype=torch.long)
        pos = torch.arange(m, n, dtype=torch.long).unsqueeze(0)
        logits = self._forward(ids, mask[:, :n], pos, cache, 1)
        return logits[:, -1].float(), DecodeState(cache=cache, mask=mask, length=n,
                                                  next_pos=torch.tensor([[n]], dtype=torch.long),
                                                  shared=[False], cached=[m])

    @torch.inference_mode()
    def remember(self, state: DecodeState, row: int, tokens: list[int]) -> None:
        """Keep the KV of a row leaving the batch in the prefix cache. `tokens` are the row's
        tokens whose KV is in the cache: its last `len(tokens)` columns."""
        if self.prefix_cache is None:
            return
        n = len(tokens)
        if n < self.prefix_cache.min_match or n > state.length:
            return
        start = state.length - n
        if not bool(state.mask[row, start:state.length].all()):
            return
        layers = getattr(state.cache, "layers", None)
        if not layers or not all(is_plain_layer(layer) and getattr(layer, "keys", None) is not None
                                 for layer in layers):
            return
        keys = [layer.keys[row, :, start:state.length].clone() for layer in layers]
        values = [layer.values[row, :, start:state.length].clone() for layer in layers]
        self.prefix_cache.insert(list(tokens), keys, values)

    def clear_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @torch.inference_mode()
    def decode(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: feed `tokens` [B] and return next logits [B, V] fp32."""
        if state.length >= state.mask.shape[1]:  # grow (only when rows were retracted with output)
            extra = torch.zeros((state.mask.shape[0], state.mask.shape[1]), dtype=torch.long)
            state.mask = torch.cat([state.mask, extra], dim=1)
        state.mask[:, state.length] = 1
        state.length += 1
        logits = self._forward(
            tokens.unsqueeze(1), state.mask[:, : state.length], state.next_pos, state.cache, 1
        )
        state.next_pos = state.next_pos + 1
        return logits[:, -1].float()

    @torch.inference_mode()
    def select_rows(self, state: DecodeState, keep: list[int]) -> None:
        """Drop finished rows from a running batch (and left columns no remaining row uses)."""
        idx = torch.tensor(keep, dtype=torch.long)
        state.cache.batch_select_indices(idx)
        state.mask = state.mask.index_select(0, idx)
        state.next_pos = state.next_pos.index_select(0, idx)
        # Columns on the left that are padding for every remaining row can go.
        used = state.mask[:, : state.length]
        first = int(used.any(dim=0).to(torch.int8).argmax())
        if first > 0 and self._crop_left(state.cache, first):
            state.mask = state.mask[:, first:]
            state.length -= first

    @torch.inference_mode()
    def merge(self, state: DecodeState, other: DecodeState) -> bool:
        """Append `other`'s rows (a fresh prefill) to a running batch, in place (continuous batching).

        Both are left-padded; the shorter side gets more left padding (masked out) so the cache
        columns line up. Returns False (and changes nothing) for caches this cannot pad.
        """
        layers_a = getattr(state.cache, "layers", None)
        layers_b = getattr(other.cache, "layers", None)
        if not layers_a or not layers_b or len(layers_a) != len(layers_b):
            return False
        if not all(is_plain_layer(layer) and getattr(layer, "keys", None) is not None
                   and layer.keys.dim() == 4 for layer in (*layers_a, *layers_b)):
            return False
        la, lb = state.length, other.length
        width = max(la, lb)

        def pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
            if n == 0:
                return t
            return torch.cat([t.new_zeros((*t.shape[:-2], n, t.shape[-1])), t], dim=-2)

        for a, b in zip(layers_a, layers_b):
            a.keys = torch.cat([pad_left(a.keys, width - la), pad_left(b.keys, width - lb)], dim=0)
            a.values = torch.cat([pad_left(a.values, width - la), pad_left(b.values, width - lb)], dim=0)
        room = max(state.mask.shape[1] - la, other.mask.shape[1] - lb)
        mask = torch.zeros((state.mask.shape[0] + other.mask.shape[0], width + room), dtype=torch.long)
        mask[: state.mask.shape[0], width - la: width] = state.mask[:, :la]
        mask[state.mask.shape[0]:, width - lb: width] = other.mask[:, :lb]
        state.mask = mask
        state.length = width
        state.next_pos = torch.cat([state.next_pos, other.next_pos], dim=0)
        state.shared = list(state.shared) + list(other.shared)
        state.cached = list(state.cached) + list(other.cached)
        return True

    @staticmethod
    def _crop_left(cache, n: int) -> bool:
        layers = getattr(cache, "layers", None)
        if not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
            return False
        if not all(is_plain_layer(layer) for layer in layers):
            return False  # sliding-window / special layers keep their own bookkeeping
        for layer in layers:
            if layer.keys is not None and layer.keys.dim() == 4:
                layer.keys = layer.keys[:, :, n:]
                layer.values = layer.values[:, :, n:]
        return True

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
            state[n].copy_(t)
        return len(named)

    @staticmethod
    def read_safetensors_dir(path: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        p = Path(path)
        if p.is_file():
            files = [str(p)]
        else:
            if not p.is_dir():
                raise WeightUpdateError(f"model_path {path!r} is not a directory")
            index = p / "model.safetensors.index.json"
            if index.exists():
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted({str(p / f) for f in weight_map.values()})
            else:
                files = sorted(glob.glob(str(p / "*.safetensors")))
        if not files:
            raise WeightUpdateError(f"no *.safetensors files in {path!r}")
        named: dict[str, torch.Tensor] = {}
        for f in files:
            named.update(load_file(f))
        return named
