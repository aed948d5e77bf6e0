"""Colocated weight sync the way SGLang does it on one GPU: the trainer sends the engine IPC
handles of its tensors (`slime.utils.tensor_ipc`) through `/update_weights_from_tensor` with
`load_format: "torch_ipc"`, and the engine copies from the mapped memory into its own weights:
device to device on a GPU, no trip through the host and no safetensors bytes.

Only for an engine on the same machine (and, for CUDA tensors, the same GPU or one it can map).
On the CPU the same path runs with shared-memory copies of the tensors, which is what the CPU
tests exercise; engines elsewhere take `slime.sync.tensor.push_weights` or the collective path
(`slime.sync.distributed`).
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from slime.engine.client import client_for
from slime.sync.tensor import dedupe_tied
from slime.utils import tensor_ipc


def ipc_payload(
    named: dict[str, torch.Tensor], weight_version: str | None = None, flush_cache: bool = True
) -> dict[str, Any]:
    """The `/update_weights_from_tensor` body for tensors that `tensor_ipc.shareable` returned."""
    payload: dict[str, Any] = {
        "serialized_named_tensors": [base64.b64encode(tensor_ipc.dumps(named)).decode("ascii")],
        "load_format": tensor_ipc.LOAD_FORMAT,
        "flush_cache": flush_cache,
    }
    if weight_version is not None:
        payload["weight_version"] = weight_version
    return payload


def push_weights_ipc(engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str) -> None:
    """Every engine maps and copies `state` (tied weights once). The shared tensors stay alive
    here until every engine has answered, which it does after its copy has finished."""
    shared = tensor_ipc.shareable(dedupe_tied(state))
    payload = ipc_payload(shared, weight_version)

    def one(url: str) -> None:
        # the client's plain POST: the body is already built (it is no safetensors upload)
        client_for(url)._call("POST", "/update_weights_from_tensor", payload)

    with ThreadPoolExecutor(max_workers=max(1, len(engine_urls))) as pool:
        list(pool.map(one, engine_urls))
    if any(t.is_cuda for t in shared.values()):
        torch.cuda.synchronize()
    del shared
