"""A KV cache layer that appends in place.

Hugging Face's `DynamicLayer` appends each decode step's keys and values with `torch.cat`, which
copies the whole cache every step: at 256 rows x ~100 tokens on the 25M model that copy was 28%
of a decode step, growing with length. `GrowableLayer` keeps keys and values at the front of a
buffer with spare room and writes new positions in place; `keys`/`values` are views of the used
part, so every other piece of code (HF attention, row selection, merging, cropping) sees the same
tensors as before. Code that replaces `keys`/`values` with new tensors (selecting rows, merging
batches, cropping) is detected on the next append and the buffer is rebuilt once.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class GrowableLayer(DynamicLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _owns_keys(self) -> bool:
        """Are `keys`/`values` still the front of our buffers (nobody replaced them)?"""
        k, kb, v, vb = self.keys, self._kbuf, self.values, self._vbuf
        return (
            kb is not None
            and vb is not None
            and k is not None
            and v is not None
            and k.dim() == 4
            and k.data_ptr() == kb.data_ptr()
            and k.stride() == kb.stride()
            and v.data_ptr() == vb.data_ptr()
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        cur = self.keys.shape[-2] if self.keys is not None and self.keys.dim() == 4 else 0
        n = key_states.shape[-2]
        kb, vb = self._kbuf, self._vbuf
        fits = self._owns_keys() and kb is not None and kb.shape[:2] == key_states.shape[:2] and cur + n <= kb.shape[-2]
        if not fits or kb is None or vb is None:
            capacity = cur + n + max(64, (cur + n) // 2)  # amortised: a rebuild every many steps
            shape = (*key_states.shape[:2], capacity, key_states.shape[-1])
            kb, vb = key_states.new_empty(shape), value_states.new_empty((*shape[:3], value_states.shape[-1]))
            if cur:
                assert self.keys is not None and self.values is not None
                kb[:, :, :cur] = self.keys
                vb[:, :, :cur] = self.values
            self._kbuf, self._vbuf = kb, vb
        kb[:, :, cur : cur + n] = key_states
        vb[:, :, cur : cur + n] = value_states
        self.keys = kb[:, :, : cur + n]
        self.values = vb[:, :, : cur + n]
        return self.keys, self.values


def is_plain_layer(layer) -> bool:
    """A full-attention layer whose keys/values are plain [B, H, L, D] tensors we may re-pad or crop."""
    return (
        isinstance(layer, DynamicLayer)
        and not getattr(layer, "is_sliding", False)
        and type(layer) in (DynamicLayer, GrowableLayer)
    )


def use_growable_layers(cache) -> None:
    """Swap a fresh DynamicCache's plain layers for GrowableLayer (sliding-window ones stay)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and not getattr(layer, "is_initialized", False):
            layers[i] = GrowableLayer()
