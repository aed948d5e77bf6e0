"""Cross-request prefix cache: the KV of finished requests, reused by later requests that start
with the same tokens (SGLang's radix-cache idea, kept simple).

When a request leaves the running batch (finished or aborted), the KV of its tokens (prompt and
output, all but the last sampled token, whose KV was never computed) is copied out and kept here,
least recently used first out, within `max_tokens` token positions. A new request whose prompt
shares at least `min_match` leading tokens with a kept entry starts from that entry's KV and
prefills only the rest: a multi-turn trajectory's next turn (its history plus the tool's
answer), or a partial-rollout sample resumed after an abort, skip re-prefilling their history.

The cache never serves stale KV: the engine clears it whenever weights change, on
`flush_cache`, and when memory is released; an entry is only added when all of its KV was
computed by the current weights.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PrefixEntry:
    tokens: np.ndarray  # int64 [L]
    keys: list[torch.Tensor]  # per layer [kv_heads, L, head_dim]
    values: list[torch.Tensor]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    def __init__(self, max_tokens: int, min_match: int = 32):
        self.max_tokens = int(max_tokens)
        self.min_match = int(min_match)
        self._entries: OrderedDict[bytes, PrefixEntry] = OrderedDict()
        # entries by their first `min_match` tokens: only those can share `min_match` tokens with
        # a prompt (or be a prefix of a new entry), so lookups never scan the whole cache
        self._by_head: dict[bytes, set[bytes]] = {}
        self.num_tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._by_head.clear()
        self.num_tokens = 0

    def _head(self, tokens: np.ndarray) -> bytes:
        return tokens[: self.min_match].tobytes()

    def _pop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.num_tokens -= len(entry)
        same = self._by_head[self._head(entry.tokens)]
        same.discard(key)
        if not same:
            del self._by_head[self._head(entry.tokens)]

    def insert(self, tokens: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Keep the KV of `tokens` (each layer's tensors [kv_heads, len(tokens), head_dim])."""
        n = len(tokens)
        if n < self.min_match or n > self.max_tokens:
            return
        arr = np.asarray(tokens, dtype=np.int64)
        key = arr.tobytes()
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        # an entry that is a prefix of this one adds nothing any more
        head = self._head(arr)
        for k in [
            k
            for k in self._by_head.get(head, ())
            if len(self._entries[k]) <= n and common_prefix_len(self._entries[k].tokens, arr) == len(self._entries[k])
        ]:
            self._pop(k)
        self._entries[key] = PrefixEntry(arr, keys, values)
        self._by_head.setdefault(head, set()).add(key)
        self.num_tokens += n
        while self.num_tokens > self.max_tokens:
            self._pop(next(iter(self._entries)))  # least recently used

    def match(self, prompt: list[int]) -> tuple[int, PrefixEntry | None]:
        """(tokens of `prompt` whose KV an entry holds, that entry); at most len(prompt) - 1 tokens,
        since the last prompt token must run through the model to give the next token's logits."""
        if not self._entries or len(prompt) <= self.min_match:
            return 0, None
        arr = np.asarray(prompt, dtype=np.int64)
        best, best_entry, best_key = 0, None, None
        for key in self._by_head.get(self._head(arr), ()):
            entry = self._entries[key]
            m = min(common_prefix_len(entry.tokens, arr), len(prompt) - 1)
            if m > best:
                best, best_entry, best_key = m, entry, key
        if best_key is None or best < self.min_match:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best
        return best, best_entry
