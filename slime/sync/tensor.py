"""Weight sync from the trainer into engine servers, and the check that it worked.

Rank 0 sends the full state dict to each engine's `/update_weights_from_tensor` as
safetensors bytes. Tied weights (lm_head sharing the embedding) are sent once: the engine's
own model ties them again, so sending both would only double the bytes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from slime.engine.client import client_for


def dedupe_tied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        ptr = t.untyped_storage().data_ptr() if t.numel() else id(t)
        if ptr in seen:
            continue
        seen.add(ptr)
        out[name] = t.detach().contiguous()
    return out


def push_weights(engine_urls: list[str], state: dict[str, torch.Tensor], *, weight_version: str) -> None:
    tensors = dedupe_tied(state)

    def one(url: str) -> None:
        client_for(url).update_weights_from_tensor(tensors, weight_version=weight_version)

    with ThreadPoolExecutor(max_workers=max(1, len(engine_urls))) as pool:
        list(pool.map(one, engine_urls))


def engine_sequence_log_probs(engine_url: str, token_ids: list[int]) -> list[float]:
    """The engine's log-probs of tokens[1:] given their prefixes (temperature 1, raw logits)."""
    out = client_for(engine_url).generate(
        {
            "input_ids": token_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
    )
    lps = out["meta_info"]["input_token_logprobs"]
    return [float(lp[0]) for lp in lps[1:]]
