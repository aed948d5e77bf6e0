"""PrefixCache bookkeeping: longest shared prefix, superseded prefixes, LRU eviction by tokens."""

import torch

from slime.engine.prefix_cache import PrefixCache


def _kv(n):
    return [torch.zeros(1, n, 2)], [torch.zeros(1, n, 2)]


def test_match_insert_and_evict():
    pc = PrefixCache(max_tokens=20, min_match=4)
    base = [1, 2, 3, 4, 5, 6]
    pc.insert(base, *_kv(6))
    pc.insert([1, 2, 3, 4, 9, 9, 9], *_kv(7))
    pc.insert([1, 2, 3], *_kv(3))  # shorter than min_match: not kept
    assert len(pc) == 2 and pc.num_tokens == 13
    # the longest shared prefix wins, and at most len(prompt) - 1 tokens
    assert pc.match(base + [7, 8])[0] == 6
    assert pc.match(base)[0] == 5
    assert pc.match([1, 2, 3, 4, 9, 9, 0])[0] == 6
    assert pc.match([1, 2, 3, 0, 5, 6, 7]) == (0, None)  # shares 3 < min_match tokens
    # a new entry that extends an old one replaces it
    pc.insert(base + [7, 8], *_kv(8))
    assert len(pc) == 2 and pc.num_tokens == 15
    # over max_tokens (15 + 6 > 20): the least recently used, [1,2,3,4,9,9,9], goes
    pc.insert([5, 5, 5, 5, 5, 5], *_kv(6))
    # (with it gone, only the 4 tokens shared with base + [7, 8] are left to reuse, not 7)
    assert pc.num_tokens == 14 and pc.match([1, 2, 3, 4, 9, 9, 9, 1])[0] == 4
    assert pc.match(base + [7, 8, 0])[0] == 8
    pc.clear()
    assert len(pc) == 0 and pc.num_tokens == 0 and pc.match(base + [7]) == (0, None)
