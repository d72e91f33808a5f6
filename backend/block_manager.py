"""Paged KV cache bookkeeping: a fixed pool of blocks, a block table per sequence.

Physical block b holds the K/V of `block_size` consecutive token positions; sequence position p lives in
block_table[p // block_size] at offset p % block_size, i.e. cache slot block_table[p // block_size] * block_size + p % block_size.
"""
from __future__ import annotations

from collections import deque

from backend.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        # Blocks promised to admitted sequences but not yet handed out (guaranteed_no_evict reservations).
        self._reserved: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_unreserved_free_blocks(self) -> int:
        return len(self._free) - sum(self._reserved.values())

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_reserve(self, seq: Sequence) -> bool:
        return self.blocks_for(seq.max_total_tokens) <= self.num_unreserved_free_blocks

    def reserve(self, seq: Sequence) -> None:
        """Promise the blocks a sequence can ever need, so it never waits for KV (guaranteed_no_evict)."""
        needed = self.blocks_for(seq.max_total_tokens) - len(seq.block_table)
        if needed > self.num_unreserved_free_blocks:
            raise RuntimeError(f"cannot reserve {needed} KV blocks, {self.num_unreserved_free_blocks} unreserved")
        self._reserved[seq.request_id] = needed

    def ensure_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Grow the block table so positions [0, num_tokens) have cache slots."""
        missing = self.blocks_for(num_tokens) - len(seq.block_table)
        for _ in range(missing):
            reserved = self._reserved.get(seq.request_id, 0)
            if reserved == 0 and self.num_unreserved_free_blocks <= 0:
                raise RuntimeError(f"KV cache exhausted for {seq.request_id!r}")
            if reserved:
                self._reserved[seq.request_id] = reserved - 1
            seq.block_table.append(self._free.popleft())

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks and reservation to the pool."""
        self._reserved.pop(seq.request_id, None)
        self._free.extend(seq.block_table)
        seq.block_table = []

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
