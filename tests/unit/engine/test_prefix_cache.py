"""Prefix caching (shared KV blocks by content, chained keys, salts, LRU tail-first eviction) and the
max_utilization policy (preemption by recompute), on the tiny checkpoint: outputs never change, only work does."""
from __future__ import annotations

from backend.engine.block_manager import BlockManager
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request

BLOCK = 4


def request(rid: str, prompt: tuple[int, ...], max_tokens: int = 6, salt: str | None = None) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), cache_salt=salt)


def last_perf(outputs):
    return outputs[-1].perf


def test_shared_prefix_reuses_blocks_and_keeps_outputs(make_engine, prompts, run_engine, hf_greedy, kv_idle):
    engine = make_engine(enable_kv_cache_reuse=True, tokens_per_block=BLOCK)
    prefix, tail_a, tail_b = prompts([13, 3, 5], engine.vocab_size, seed=3)
    first = run_engine(engine, [request("a", prefix + tail_a)])["a"]
    assert last_perf(first).kv_cache_reused_blocks == 0
    second = run_engine(engine, [request("b", prefix + tail_b)])["b"]
    # 13 shared tokens = 3 full blocks of 4; the 4th block differs.
    assert last_perf(second).kv_cache_reused_blocks == 3
    assert last_perf(second).kv_cache_alloc_total_blocks == (13 + 5 + 6 + BLOCK - 1) // BLOCK
    assert [t for o in second for t in o.new_token_ids] == hf_greedy(prefix + tail_b, 6)
    kv_idle(engine.blocks)  # cached blocks are free blocks: reclaimable on demand
    assert engine.blocks.num_cached_blocks > 0
    assert engine.blocks.prefix_hit_rate > 0


def test_fully_cached_prompt_still_computes_its_last_token(make_engine, prompts, run_engine, hf_greedy):
    engine = make_engine(enable_kv_cache_reuse=True, tokens_per_block=BLOCK)
    (prompt,) = prompts([16], engine.vocab_size, seed=4)
    run_engine(engine, [request("a", prompt)])
    again = run_engine(engine, [request("b", prompt)])["b"]
    assert last_perf(again).kv_cache_reused_blocks == (16 - 1) // BLOCK  # 3: the last block holds the last token
    assert [t for o in again for t in o.new_token_ids] == hf_greedy(prompt, 6)


def test_concurrent_requests_share_blocks_by_reference(make_engine, prompts, run_engine, hf_greedy, kv_idle):
    engine = make_engine(enable_kv_cache_reuse=True, tokens_per_block=BLOCK, max_num_tokens=16)
    prefix, *tails = prompts([12, 2, 3, 4], engine.vocab_size, seed=5)
    run_engine(engine, [request("warm", prefix + tails[0])])
    reqs = [request(f"r{i}", prefix + t) for i, t in enumerate(tails)]
    outs = run_engine(engine, reqs)
    for r in reqs:
        assert last_perf(outs[r.request_id]).kv_cache_reused_blocks == 3
        assert [t for o in outs[r.request_id] for t in o.new_token_ids] == hf_greedy(r.prompt_ids, 6)
    kv_idle(engine.blocks)


def test_salted_requests_never_share_across_salts(make_engine, prompts, run_engine):
    engine = make_engine(enable_kv_cache_reuse=True, tokens_per_block=BLOCK)
    (prompt,) = prompts([17], engine.vocab_size, seed=6)
    run_engine(engine, [request("a1", prompt, salt="tenant-a")])
    other = run_engine(engine, [request("b1", prompt, salt="tenant-b")])["b1"]
    same = run_engine(engine, [request("a2", prompt, salt="tenant-a")])["a2"]
    unsalted = run_engine(engine, [request("u", prompt)])["u"]
    assert last_perf(other).kv_cache_reused_blocks == 0
    assert last_perf(same).kv_cache_reused_blocks == 4
    assert last_perf(unsalted).kv_cache_reused_blocks == 0


def test_cache_off_reuses_nothing(make_engine, prompts, run_engine):
    engine = make_engine(tokens_per_block=BLOCK, enable_kv_cache_reuse=False)
    (prompt,) = prompts([17], engine.vocab_size, seed=7)
    run_engine(engine, [request("a", prompt)])
    assert last_perf(run_engine(engine, [request("b", prompt)])["b"]).kv_cache_reused_blocks == 0
    assert engine.blocks.num_cached_blocks == 0


def test_eviction_is_least_recently_freed_tail_first(make_seq):
    blocks = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_seq("a", prompt_ids=(1, 2, 3, 4, 5))  # 2 full blocks + 1 partial
    blocks.ensure_slots(a, 5)
    a.num_computed_tokens = 5
    blocks.register_full_blocks(a)
    head, tail, partial = a.block_table
    blocks.free(a)
    assert blocks.num_cached_blocks == 2
    # One fresh block: the uncached ones go first (the partial block, then the never-used one).
    b = make_seq("b", prompt_ids=(9, 9, 9))
    blocks.ensure_slots(b, 4)
    assert partial in b.block_table and head not in b.block_table and tail not in b.block_table
    c = make_seq("c", prompt_ids=(8, 8))
    blocks.ensure_slots(c, 2)  # the pool is now down to cached blocks: the tail is evicted before the head
    assert c.block_table == [tail] and blocks.num_cached_blocks == 1
    d = make_seq("d", prompt_ids=(1, 2, 3))
    assert blocks.match_prefix(d) == 2 and d.block_table == [head]


def test_max_utilization_preempts_and_recomputes_without_changing_outputs(make_engine, prompts, run_engine,
                                                                          hf_greedy, kv_idle):
    # 12 blocks of 4 tokens; four requests of 30 tokens each cannot all hold their KV at once.
    engine = make_engine(policy="max_utilization", max_tokens_in_paged_kv_cache=48, tokens_per_block=BLOCK,
                         max_seq_len=48, max_input_len=40)
    ps = prompts([10, 12, 14, 16], engine.vocab_size, seed=8)
    reqs = [request(f"r{i}", p, max_tokens=20) for i, p in enumerate(ps)]
    outs = run_engine(engine, reqs)
    assert engine.scheduler.num_preempted > 0
    for r in reqs:
        assert [t for o in outs[r.request_id] for t in o.new_token_ids] == hf_greedy(r.prompt_ids, 20)
    kv_idle(engine.blocks)


def test_guaranteed_no_evict_never_preempts(make_engine, prompts, run_engine, hf_greedy):
    engine = make_engine(max_tokens_in_paged_kv_cache=48, tokens_per_block=BLOCK, max_seq_len=48, max_input_len=40)
    ps = prompts([10, 12, 14, 16], engine.vocab_size, seed=8)
    reqs = [request(f"r{i}", p, max_tokens=20) for i, p in enumerate(ps)]
    outs = run_engine(engine, reqs)
    assert engine.scheduler.num_preempted == 0
    for r in reqs:
        assert [t for o in outs[r.request_id] for t in o.new_token_ids] == hf_greedy(r.prompt_ids, 20)
