"""Paged KV cache bookkeeping: a fixed pool of blocks, a block table per sequence, prefix reuse.

Physical block b holds the K/V of `block_size` consecutive token positions; sequence position p lives in
block_table[p // block_size] at offset p % block_size, i.e. cache slot block_table[p // block_size] * block_size + p % block_size.

With prefix caching, a block is shared by reference count: full blocks are indexed by content (PrefixCache) and
stay cached after their last user frees them, until the pool needs them back. Free blocks are handed out least
recently freed first; a sequence frees its blocks tail first, so its tail is evicted before its head (another
request is likelier to share a prefix's head than its tail). A block's key also carries its rope regime tag
(rope_regime.py): K is stored rotated, so only sequences that rotate the same way share it.

Sliding window (every layer attends to the last `window` positions only): blocks wholly before the window of the
next position to compute are released after each step (their block-table entries become None); a sequence then
holds at most max_live_blocks at once, which is what a guaranteed reservation promises it.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from backend.engine.prefix_cache import PrefixCache, block_key
from backend.engine.rope_regime import RopeRegime
from backend.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 window: int | None = None, max_chunk_tokens: int = 0, regime: RopeRegime = RopeRegime()) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be > 0")
        if window is not None and (window < 1 or max_chunk_tokens < 1):
            raise ValueError(f"a sliding window ({window}) needs window >= 1 and max_chunk_tokens >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window, self.max_chunk_tokens, self.regime = window, max_chunk_tokens, regime
        self.cache = PrefixCache() if enable_prefix_caching else None
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest first
        self._refs = [0] * num_blocks
        # Blocks promised to admitted sequences but not yet handed out (guaranteed_no_evict reservations).
        self._reserved: dict[str, int] = {}
        # Over admitted requests: full prompt blocks looked up in the prefix cache, and found.
        self.prefix_lookups = 0
        self.prefix_hits = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones included: they are reclaimed on demand)."""
        return len(self._free)

    @property
    def num_unreserved_free_blocks(self) -> int:
        return len(self._free) - sum(self._reserved.values())

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cache) if self.cache is not None else 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_live_blocks(self, num_tokens: int) -> int:
        """The most blocks a sequence of num_tokens holds at once: all of them, or with a sliding window those of
        the window before a chunk plus the chunk's (window - 1 + chunk tokens, straddling one more block)."""
        whole = self.blocks_for(num_tokens)
        if self.window is None:
            return whole
        return min(whole, self.blocks_for(self.window - 1 + self.max_chunk_tokens) + 1)

    def first_live_position(self, next_position: int) -> int:
        """The first position a query at next_position (or later) can see: 0, or the start of its window."""
        return 0 if self.window is None else max(0, next_position - self.window + 1)

    def _future_blocks(self, seq: Sequence) -> int:
        """Blocks seq may still claim while holding no more than max_live_blocks at once."""
        live = sum(b is not None for b in seq.block_table)
        return min(self.max_live_blocks(seq.max_total_tokens) - live,
                   self.blocks_for(seq.max_total_tokens) - len(seq.block_table))

    def can_reserve(self, seq: Sequence) -> bool:
        return self._future_blocks(seq) <= self.num_unreserved_free_blocks

    def reserve(self, seq: Sequence) -> None:
        """Promise the blocks a sequence can ever need, so it never waits for KV (guaranteed_no_evict)."""
        needed = self._future_blocks(seq)
        if needed > self.num_unreserved_free_blocks:
            raise RuntimeError(f"cannot reserve {needed} KV blocks, {self.num_unreserved_free_blocks} unreserved")
        self._reserved[seq.request_id] = needed

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether positions [0, num_tokens) can get slots now (reserved blocks count for their owner)."""
        missing = self.blocks_for(num_tokens) - len(seq.block_table)
        return missing <= self._reserved.get(seq.request_id, 0) + self.num_unreserved_free_blocks

    def ensure_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Grow the block table so positions [0, num_tokens) have cache slots."""
        missing = self.blocks_for(num_tokens) - len(seq.block_table)
        for _ in range(missing):
            reserved = self._reserved.get(seq.request_id, 0)
            if reserved == 0 and self.num_unreserved_free_blocks <= 0:
                raise RuntimeError(f"KV cache exhausted for {seq.request_id!r}")
            if reserved:
                self._reserved[seq.request_id] = reserved - 1
            seq.block_table.append(self._claim(next(iter(self._free)), reuse=False))
            seq.new_blocks += 1

    def match_prefix(self, seq: Sequence) -> int:
        """Take the cached blocks that hold the start of seq's tokens; returns how many tokens they cover.

        At least the last token is left to compute: its logits give the next token.
        """
        if self.cache is None or seq.block_table:
            return 0
        tokens, size = seq.token_ids, self.block_size
        parent = None
        for i in range((len(tokens) - 1) // size):
            chunk, extra = tuple(tokens[i * size : (i + 1) * size]), self._extra_key(seq, (i + 1) * size)
            if extra is None:
                break
            key = block_key(parent, chunk, extra)
            block = self.cache.lookup(key, parent, chunk, extra)
            if block is None:
                break
            seq.block_table.append(self._claim(block, reuse=True))
            seq.block_keys.append(key)
            parent = key
        seq.reused_blocks = len(seq.block_table)
        seq.num_computed_tokens = seq.reused_blocks * size
        return seq.num_computed_tokens

    def note_admitted(self, seq: Sequence) -> None:
        """Count an admitted request's prefix lookups (a request waiting for KV is looked up again every step)."""
        if self.cache is not None:
            self.prefix_lookups += (seq.num_tokens - 1) // self.block_size
            self.prefix_hits += seq.reused_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0

    def register_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks whose K/V are now complete, so later requests can reuse them."""
        if self.cache is None:
            return
        size = self.block_size
        for i in range(len(seq.block_keys), seq.num_computed_tokens // size):
            parent = seq.block_keys[-1] if seq.block_keys else None
            chunk, extra = tuple(seq.token_ids[i * size : (i + 1) * size]), self._extra_key(seq, (i + 1) * size)
            if extra is None or seq.block_table[i] is None:
                return  # not shareable (its rope regime), and so neither is anything after it
            key = block_key(parent, chunk, extra)
            self.cache.register(key, seq.block_table[i], parent, chunk, extra)
            seq.block_keys.append(key)

    def _extra_key(self, seq: Sequence, block_end: int) -> tuple[str | None, str] | None:
        """What a block must match besides its tokens: the tenant's salt and the block's rope regime tag."""
        tag = self.regime.block_tag(seq.num_prompt_tokens, seq.num_tokens, block_end)
        return None if tag is None else (seq.request.cache_salt, tag)

    def release_outside_window(self, seq: Sequence) -> None:
        """Release the blocks wholly before the window of seq's next position (no layer can see them again)."""
        first = self.first_live_position(seq.num_computed_tokens)
        released = 0
        for i in range(first // self.block_size):
            block = seq.block_table[i]
            if block is not None:
                seq.block_table[i] = None
                self._unref(block)
                released += 1
        if released and seq.request_id in self._reserved:
            self._reserved[seq.request_id] = self._future_blocks(seq)

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks and reservation to the pool (cached blocks stay reusable until reclaimed)."""
        self._reserved.pop(seq.request_id, None)
        for block in reversed(seq.block_table):
            if block is not None:
                self._unref(block)
        seq.block_table = []
        seq.block_keys = []

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None
            if self.cache is None or block not in self.cache:
                self._free.move_to_end(block, last=False)  # uncached blocks are handed out first

    def slots(self, seqs: list[Sequence], lengths: list[int], firsts: list[int] | None = None) -> torch.Tensor:
        """Cache slot of positions firsts[b] <= p < lengths[b] of seqs[b]: (B, longest span) int64, column j holding
        position firsts[b] + j, 0 past a sequence's length (and for released blocks, which no query sees).
        Built in NumPy (one call per step, ~10 small array operations): torch's per-operation cost made the same
        operations ~100 us of a decode step at 16 sequences on the development CPU, NumPy's ~25 (perf/ISSUE16.md)."""
        firsts = [0] * len(seqs) if firsts is None else firsts
        B, size = len(seqs), self.block_size
        width = max(len(seq.block_table) for seq in seqs)
        spans = np.asarray(lengths, dtype=np.int64) - np.asarray(firsts, dtype=np.int64)  # (B,) columns each holds
        span = int(spans.max())
        # (B, blocks) padded block tables, built as one list: one array a step, not one per sequence
        tables = np.array([[0 if x is None else x for x in seq.block_table] + [0] * (width - len(seq.block_table))
                           for seq in seqs], dtype=np.int64)
        held = (tables[:, :, None] * size + np.arange(size)).reshape(B, -1)  # (B, width * size): slot of positions
        if any(firsts):  # column j of row b: position firsts[b] + j (clipped: past a length it is zeroed below)
            columns = np.minimum(np.asarray(firsts, dtype=np.int64)[:, None] + np.arange(span), width * size - 1)
            slots = np.take_along_axis(held, columns, axis=1)
        else:  # every table covers its sequence's length, so span <= width * size
            slots = held[:, :span].copy()
        slots[np.arange(span) >= spans[:, None]] = 0
        return torch.from_numpy(slots)

    def _claim(self, block: int, reuse: bool) -> int:
        """Take a reference on a block: a cache hit (reuse its K/V) or a fresh one (evict what it cached)."""
        if self._refs[block] == 0:
            del self._free[block]
            if self.cache is not None and not reuse:
                self.cache.evict(block)
        self._refs[block] += 1
        return block
