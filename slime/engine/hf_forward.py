"""The engine's forward for any HF causal LM: the model's own forward with a `DynamicCache`.

Used for architectures the native forward (`slime.engine.native_forward`) does not cover, and
with `--model-impl transformers`. The running batch is left-padded: each row's cache is as long
as the longest row; rows joining a running batch are prefilled on their own and merged (re-padded
on the left), finished rows are dropped by selecting the remaining ones. Decode appends keys and
values in place (`slime.engine.kv_cache.GrowableLayer`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from slime.engine.kv_cache import is_plain_layer, use_growable_layers


@dataclass
class DecodeState:
    """KV cache and bookkeeping of a running batch (rows are left-padded)."""

    cache: Any  # a transformers Cache (DynamicCache or the model's own)
    mask: torch.Tensor  # [B, capacity] long, 1 = real token; only [:, :length] is in use
    length: int  # columns in use (= cache sequence length)
    next_pos: torch.Tensor  # [B, 1] long: position id of the next token per row
    cached: list[int] = field(default_factory=list)  # prompt tokens per row whose KV was reused


def _take_rows(state: DecodeState, idx: torch.Tensor) -> None:
    """Row idx[i] of the batch becomes row i (cache, mask, positions, reuse counts), in place."""
    state.cache.batch_select_indices(idx)
    state.mask = state.mask.index_select(0, idx)
    state.next_pos = state.next_pos.index_select(0, idx)
    state.cached = [state.cached[j] for j in idx.tolist()]


@dataclass
class HFBatch:
    state: DecodeState | None = None

    @property
    def rows(self) -> int:
        return 0 if self.state is None else int(self.state.mask.shape[0])

    def live(self) -> DecodeState:
        """The running batch's state: asking it of an empty batch is a scheduler bug."""
        if self.state is None:
            raise RuntimeError("the batch has no rows")
        return self.state


class HFForward:
    def __init__(self, model, pad_token_id: int):
        self.model = model
        self.config = model.config
        self.pad_token_id = pad_token_id
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.2x

    def _new_cache(self):
        try:
            cache = DynamicCache(config=self.config)
        except TypeError:
            cache = DynamicCache()
        use_growable_layers(cache)  # decode appends in place instead of copying the cache
        return cache

    def _forward(self, input_ids, attention_mask, position_ids, cache, logits_to_keep: int):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self._cache_kwarg: cache},
        )
        return out.logits

    # ------------------------------------------------------------------ batch interface
    def new_batch(self) -> HFBatch:
        return HFBatch()

    @torch.inference_mode()
    def add_rows(
        self, batch: HFBatch, prompts: list[list[int]], max_new: int, full_logits: bool, hits: dict, share: bool
    ):
        """Prefill `prompts` and append them to the batch. Returns (last logits [n, V] fp32,
        per-row prompt logits or None, per-row reused prompt tokens), or None when this cache type
        cannot be merged into a running batch (nothing changed then)."""
        last, all_logits, state = self._prefill(prompts, max_new, full_logits, hits, share)
        full = None
        if all_logits is not None:
            width = all_logits.shape[1]
            full = [all_logits[i, width - len(p) :] for i, p in enumerate(prompts)]
        if batch.state is None:
            batch.state = state
        elif not self._merge(batch.state, state):
            return None
        return last, full, list(state.cached)

    @torch.inference_mode()
    def decode(self, batch: HFBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: feed `tokens` [B] and return next logits [B, V] fp32."""
        state = batch.live()
        if state.length >= state.mask.shape[1]:  # grow (only when rows were retracted with output)
            extra = torch.zeros((state.mask.shape[0], state.mask.shape[1]), dtype=torch.long)
            state.mask = torch.cat([state.mask, extra], dim=1)
        state.mask[:, state.length] = 1
        state.length += 1
        logits = self._forward(tokens.unsqueeze(1), state.mask[:, : state.length], state.next_pos, state.cache, 1)
        state.next_pos = state.next_pos + 1
        return logits[:, -1].float()

    @torch.inference_mode()
    def select_rows(self, batch: HFBatch, keep: list[int]) -> None:
        """Rows `keep[i]` become rows i (finished rows leave; left columns no row uses go)."""
        state = batch.live()
        _take_rows(state, torch.tensor(keep, dtype=torch.long))
        used = state.mask[:, : state.length]
        first = int(used.any(dim=0).to(torch.int8).argmax())
        if first > 0 and self._crop_left(state.cache, first):
            state.mask = state.mask[:, first:]
            state.length -= first

    def row_kv(self, batch: HFBatch, row: int, n: int):
        """The KV of row `row`'s last `n` cached tokens (per layer [kv_heads, n, head_dim]), or
        None when they are not all real tokens of plain layers."""
        state = batch.live()
        if n > state.length:
            return None
        start = state.length - n
        if not bool(state.mask[row, start : state.length].all()):
            return None
        layers = getattr(state.cache, "layers", None)
        if not layers or not all(
            is_plain_layer(layer) and getattr(layer, "keys", None) is not None for layer in layers
        ):
            return None
        return (
            [layer.keys[row, :, start : state.length].clone() for layer in layers],
            [layer.values[row, :, start : state.length].clone() for layer in layers],
        )

    # ------------------------------------------------------------------ prefill
    def _prefill(self, prompts, max_new, full_logits, hits, share):
        """Left-padded prefill. Prefix sharing: identical prompts are prefilled once and their KV
        rows copied. Prompts with a prefix-cache hit start from the entry's KV."""
        if hits:
            got = self._prefill_with_hits(prompts, max_new, hits, share)
            if got is not None:
                return got
        unique: dict[tuple[int, ...], int] = {}
        src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        if share and len(unique) < len(prompts):
            last, all_logits, state = self._prefill_plain([list(p) for p in unique], max_new, full_logits)
            idx = torch.tensor(src, dtype=torch.long)
            _take_rows(state, idx)  # repeated indices copy the shared rows
            first_row = {u: src.index(u) for u in set(src)}
            state.cached = [
                len(p) if first_row[u] != row else 0 for row, (p, u) in enumerate(zip(prompts, src, strict=True))
            ]
            return last.index_select(0, idx), (None if all_logits is None else all_logits.index_select(0, idx)), state
        return self._prefill_plain(prompts, max_new, full_logits)

    def _prefill_plain(self, prompts, max_new, full_logits):
        b = len(prompts)
        max_len = max(len(p) for p in prompts)
        capacity = max_len + max(max_new, 0) + 1
        ids = torch.full((b, max_len), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, capacity), dtype=torch.long)
        for i, p in enumerate(prompts):
            n = len(p)
            ids[i, max_len - n :] = torch.tensor(p, dtype=torch.long)
            mask[i, max_len - n : max_len] = 1
        used = mask[:, :max_len]
        pos = (used.cumsum(-1) - 1).clamp_min_(0)
        cache = self._new_cache()
        logits = self._forward(ids, used, pos, cache, 0 if full_logits else 1)
        all_logits = logits.float() if full_logits else None
        last = logits[:, -1].float()
        lengths = torch.tensor([[len(p)] for p in prompts], dtype=torch.long)
        return last, all_logits, DecodeState(cache=cache, mask=mask, length=max_len, next_pos=lengths, cached=[0] * b)

    def _prefill_with_hits(self, prompts, max_new, hits, share):
        """Rows without a hit in one batched prefill, each hit on its own cache, merged in the
        original row order; None when the cache type cannot be merged."""
        order = [i for i in range(len(prompts)) if i not in hits]
        lasts, state = [], None
        if order:
            last, _, state = self._prefill([prompts[i] for i in order], max_new, False, {}, share)
            lasts.append(last)
        for i, (m, entry) in hits.items():
            last, other = self._prefill_from_entry(prompts[i], m, entry, max_new)
            if state is None:
                state = other
            elif not self._merge(state, other):
                return None
            lasts.append(last)
            order.append(i)
        idx = torch.tensor([order.index(i) for i in range(len(prompts))], dtype=torch.long)
        assert state is not None, "a prefill of no prompts"
        _take_rows(state, idx)
        return torch.cat(lasts, dim=0).index_select(0, idx), None, state

    def _prefill_from_entry(self, prompt, m, entry, max_new):
        """Prefill `prompt[m:]` on top of the cached KV of `prompt[:m]` (one row)."""
        cache = self._new_cache()
        for layer, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
            cache.update(k[:, :m].unsqueeze(0), v[:, :m].unsqueeze(0), layer)
        n = len(prompt)
        mask = torch.zeros((1, n + max(max_new, 0) + 1), dtype=torch.long)
        mask[0, :n] = 1
        ids = torch.tensor([prompt[m:]], dtype=torch.long)
        pos = torch.arange(m, n, dtype=torch.long).unsqueeze(0)
        logits = self._forward(ids, mask[:, :n], pos, cache, 1)
        return logits[:, -1].float(), DecodeState(
            cache=cache, mask=mask, length=n, next_pos=torch.tensor([[n]], dtype=torch.long), cached=[m]
        )

    # ------------------------------------------------------------------ merge / crop
    @staticmethod
    def _merge(state: DecodeState, other: DecodeState) -> bool:
        """Append `other`'s rows to a running batch, in place. Both are left-padded; the shorter
        side gets more left padding (masked out) so the cache columns line up. Returns False (and
        changes nothing) for caches this cannot pad."""
        layers_a = getattr(state.cache, "layers", None)
        layers_b = getattr(other.cache, "layers", None)
        if not layers_a or not layers_b or len(layers_a) != len(layers_b):
            return False
        if not all(
            is_plain_layer(layer) and getattr(layer, "keys", None) is not None and layer.keys.dim() == 4
            for layer in (*layers_a, *layers_b)
        ):
            return False
        la, lb = state.length, other.length
        width = max(la, lb)

        def pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
            if n == 0:
                return t
            return torch.cat([t.new_zeros((*t.shape[:-2], n, t.shape[-1])), t], dim=-2)

        for a, b in zip(layers_a, layers_b, strict=True):
            a.keys = torch.cat([pad_left(a.keys, width - la), pad_left(b.keys, width - lb)], dim=0)
            a.values = torch.cat([pad_left(a.values, width - la), pad_left(b.values, width - lb)], dim=0)
        room = max(state.mask.shape[1] - la, other.mask.shape[1] - lb)
        mask = torch.zeros((state.mask.shape[0] + other.mask.shape[0], width + room), dtype=torch.long)
        mask[: state.mask.shape[0], width - la : width] = state.mask[:, :la]
        mask[state.mask.shape[0] :, width - lb : width] = other.mask[:, :lb]
        state.mask = mask
        state.length = width
        state.next_pos = torch.cat([state.next_pos, other.next_pos], dim=0)
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
