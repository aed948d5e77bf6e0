"""GrowableLayer appends in place and otherwise behaves exactly like HF's DynamicLayer."""

import torch
from transformers.cache_utils import DynamicLayer

from slime.engine.kv_cache import GrowableLayer


def test_same_tensors_as_dynamic_layer_through_appends_selects_and_crops():
    torch.manual_seed(0)
    grow, ref = GrowableLayer(), DynamicLayer()
    steps = [torch.randn(3, 2, 7, 4)] + [torch.randn(3, 2, 1, 4) for _ in range(150)]
    buffers = set()
    for i, k in enumerate(steps):
        v = k * 2 + 1
        gk, gv = grow.update(k, v)
        rk, rv = ref.update(k, v)
        assert torch.equal(gk, rk) and torch.equal(gv, rv)
        buffers.add(grow._kbuf.data_ptr())
        if i == 60:  # what the scheduler does: drop a row, crop left padding, then go on appending
            for layer in (grow, ref):
                layer.keys, layer.values = layer.keys[[0, 2]], layer.values[[0, 2]]
                layer.keys, layer.values = layer.keys[:, :, 3:], layer.values[:, :, 3:]
            steps[i + 1 :] = [s[:2] for s in steps[i + 1 :]]
    # in place: the buffer was rebuilt a handful of times (growth, and once after the selection),
    # not once per step as torch.cat would
    assert len(buffers) < 10
    assert grow.keys.data_ptr() == grow._kbuf.data_ptr()
