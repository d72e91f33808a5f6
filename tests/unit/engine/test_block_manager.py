"""BlockManager: reservations, block tables, cache-slot arithmetic, exhaustion."""
from __future__ import annotations

import pytest

from backend.engine.block_manager import BlockManager


def test_reserve_grow_free_returns_to_idle(make_seq, kv_idle):
    blocks = BlockManager(num_blocks=8, block_size=4)
    a, b = make_seq("a", prompt_len=6, max_tokens=5), make_seq("b", prompt_len=3, max_tokens=2)  # 11 and 5 tokens
    blocks.reserve(a)
    blocks.reserve(b)
    assert blocks.num_free_blocks == 8  # promised, not handed out yet
    assert blocks.num_unreserved_free_blocks == 8 - 3 - 2
    blocks.ensure_slots(a, 6)
    blocks.ensure_slots(b, 3)
    assert (len(a.block_table), len(b.block_table)) == (2, 1)
    assert (blocks.num_free_blocks, blocks.num_used_blocks) == (5, 3)
    assert blocks.num_unreserved_free_blocks == 3  # handing out reserved blocks does not change it
    blocks.ensure_slots(a, 11)
    blocks.ensure_slots(a, 11)  # idempotent: the slots exist
    assert len(a.block_table) == 3
    blocks.free(a)
    blocks.free(b)
    assert a.block_table == [] and b.block_table == []
    kv_idle(blocks)


def test_can_reserve_refuses_what_does_not_fit(make_seq):
    blocks = BlockManager(num_blocks=4, block_size=4)
    assert not blocks.can_reserve(make_seq("huge", prompt_len=10, max_tokens=7))  # 17 tokens: 5 blocks
    assert blocks.can_reserve(make_seq("full", prompt_len=10, max_tokens=6))  # 16 tokens: exactly 4 blocks
    first = make_seq("first", prompt_len=4, max_tokens=4)  # 2 blocks
    blocks.reserve(first)
    assert not blocks.can_reserve(make_seq("three", prompt_len=8, max_tokens=1))
    assert blocks.can_reserve(make_seq("two", prompt_len=7, max_tokens=1))
    with pytest.raises(RuntimeError, match="cannot reserve 3 KV blocks, 2 unreserved"):
        blocks.reserve(make_seq("three", prompt_len=8, max_tokens=1))


def test_slot_maps_positions_through_the_block_table(make_seq):
    blocks = BlockManager(num_blocks=6, block_size=4)
    a, b = make_seq("a", prompt_len=4), make_seq("b", prompt_len=4)
    blocks.ensure_slots(a, 4)  # a: [0]
    blocks.ensure_slots(b, 4)  # b: [1]
    blocks.ensure_slots(a, 9)  # a: [0, 2, 3]: its blocks are not contiguous
    assert a.block_table == [0, 2, 3] and b.block_table == [1]
    assert blocks.slots([a, b], [9, 4]).tolist() == [
        [0, 1, 2, 3, 8, 9, 10, 11, 12],
        [4, 5, 6, 7, 0, 0, 0, 0, 0],  # 0 past b's length
    ]
    assert [blocks.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_freed_blocks_are_reused(make_seq):
    blocks = BlockManager(num_blocks=2, block_size=4)
    a = make_seq("a")
    blocks.ensure_slots(a, 8)
    blocks.free(a)
    b = make_seq("b")
    blocks.ensure_slots(b, 8)
    assert sorted(b.block_table) == [0, 1]


def test_exhaustion_raises(make_seq):
    blocks = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", prompt_len=8)
    blocks.ensure_slots(seq, 8)
    with pytest.raises(RuntimeError, match="KV cache exhausted for 'a'"):
        blocks.ensure_slots(seq, 9)


def test_unreserved_sequence_cannot_take_reserved_blocks(make_seq):
    blocks = BlockManager(num_blocks=4, block_size=4)
    blocks.reserve(make_seq("owner", prompt_len=8, max_tokens=4))  # 3 of the 4 blocks
    intruder = make_seq("intruder", prompt_len=8)
    with pytest.raises(RuntimeError, match="exhausted"):
        blocks.ensure_slots(intruder, 8)
    assert len(intruder.block_table) == 1  # it got the one unreserved block, no more


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 4)])
def test_sizes_must_be_positive(num_blocks, block_size):
    with pytest.raises(ValueError, match="must be > 0"):
        BlockManager(num_blocks, block_size)
