"""Content index of full KV blocks, for reuse across requests that share a prefix.

A full block is keyed by a chained hash h(parent block's hash, its token ids, extra key): equal keys mean equal
whole prefixes, not just equal blocks. The extra key carries what must also match for K/V to be shareable (a
tenant's cache salt, the rope regime the keys were rotated in; later an adapter id). Token ids are stored and compared on a hit, so a hash collision can
never hand out another prefix's K/V.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

BlockKey = int


def block_key(parent: BlockKey | None, token_ids: tuple[int, ...], extra_key: Hashable) -> BlockKey:
    # Python's hash of a tuple of ints/str/None: fast and process-stable enough for an in-memory index
    # (str hashing is salted per process, which only matters across processes: the index is never shared).
    return hash((parent, token_ids, extra_key))


@dataclass(frozen=True)
class _Entry:
    block: int
    parent: BlockKey | None
    token_ids: tuple[int, ...]
    extra_key: Hashable


class PrefixCache:
    def __init__(self) -> None:
        self._by_key: dict[BlockKey, _Entry] = {}
        self._key_of_block: dict[int, BlockKey] = {}

    def lookup(self, key: BlockKey, parent: BlockKey | None, token_ids: tuple[int, ...],
               extra_key: Hashable) -> int | None:
        """The block holding exactly this prefix's K/V, or None."""
        entry = self._by_key.get(key)
        if entry is None or (entry.parent, entry.token_ids, entry.extra_key) != (parent, token_ids, extra_key):
            return None
        return entry.block

    def register(self, key: BlockKey, block: int, parent: BlockKey | None, token_ids: tuple[int, ...],
                 extra_key: Hashable) -> None:
        """Index a block whose K/V are complete; a key already indexed keeps its first block."""
        if key in self._by_key or block in self._key_of_block:
            return
        self._by_key[key] = _Entry(block, parent, token_ids, extra_key)
        self._key_of_block[block] = key

    def evict(self, block: int) -> None:
        """Forget a block about to be overwritten."""
        key = self._key_of_block.pop(block, None)
        if key is not None:
            del self._by_key[key]

    def __contains__(self, block: int) -> bool:
        return block in self._key_of_block

    def __len__(self) -> int:
        return len(self._by_key)
