"""PrefixCache alone: a key maps to a block only while parent, token ids and extra key all match, so a hash
collision can never hand out another prefix's K/V."""
from __future__ import annotations

from backend.engine.prefix_cache import PrefixCache, block_key


def test_lookup_hits_the_registered_block():
    cache = PrefixCache()
    key = block_key(None, (1, 2, 3, 4), None)
    cache.register(key, 7, None, (1, 2, 3, 4), None)
    assert cache.lookup(key, None, (1, 2, 3, 4), None) == 7 and 7 in cache and len(cache) == 1


def test_a_colliding_key_with_other_tokens_misses():
    cache = PrefixCache()
    cache.register(42, 7, None, (1, 2, 3, 4), None)  # 42 stands for a key two prefixes happen to share
    assert cache.lookup(42, None, (9, 9, 9, 9), None) is None  # same key, other tokens: no K/V handed out
    assert cache.lookup(42, 41, (1, 2, 3, 4), None) is None  # same tokens after another prefix
    assert cache.lookup(42, None, (1, 2, 3, 4), "tenant-b") is None  # same tokens, another tenant's salt


def test_first_block_wins_and_eviction_forgets():
    cache = PrefixCache()
    cache.register(5, 1, None, (1,), None)
    cache.register(5, 2, None, (1,), None)  # the same prefix computed again elsewhere: the first stays indexed
    assert cache.lookup(5, None, (1,), None) == 1 and 2 not in cache
    cache.evict(1)
    assert cache.lookup(5, None, (1,), None) is None and len(cache) == 0
    cache.evict(1)  # evicting an unindexed block is a no-op


def test_chained_keys_differ_by_parent_and_salt():
    a = block_key(None, (1, 2), None)
    assert block_key(a, (3, 4), None) != block_key(None, (3, 4), None)
    assert block_key(None, (1, 2), "s1") != block_key(None, (1, 2), "s2")
