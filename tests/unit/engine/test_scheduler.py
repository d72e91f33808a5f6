"""Scheduler: decode-first in-flight batching under a token budget, chunked prefill, FCFS admission."""
from __future__ import annotations

import random

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler
from backend.engine.scheduler_output import ScheduledSeq
from backend.engine.sequence import Request, SeqStatus, Sequence

TOKEN = 7  # what the fake model "generates": the scheduler does not look at token values


def make_scheduler(**limits) -> Scheduler:
    config = EngineConfig(**{"max_batch_size": 4, "max_num_tokens": 16, "max_input_len": 32, "max_seq_len": 64,
                             "tokens_per_block": 4, **limits})
    return Scheduler(config, BlockManager(config.kv_cache_tokens // config.tokens_per_block, config.tokens_per_block))


def step(sched: Scheduler) -> list[ScheduledSeq]:
    """One engine step without a model: what LLMEngine.step does to the sequences after the forward pass."""
    batch = sched.schedule()
    for item in batch:
        samples = item.samples
        item.seq.num_computed_tokens = item.end
        if samples:
            item.seq.append(TOKEN, None)
            if item.seq.status is SeqStatus.FINISHED:
                sched.finish(item.seq)
    return batch


def ids(batch: list[ScheduledSeq]) -> list[tuple[str, int]]:
    return [(item.seq.request_id, item.num_new_tokens) for item in batch]


def test_decodes_come_before_prefills(make_seq):
    sched = make_scheduler(max_num_tokens=16)
    a, b = make_seq("a", prompt_len=3, max_tokens=8), make_seq("b", prompt_len=20, max_tokens=8)
    sched.add(a)
    sched.add(b)
    assert ids(step(sched)) == [("a", 3), ("b", 13)]  # b's prompt is cut to the budget left
    sched.add(make_seq("c", prompt_len=2, max_tokens=8))
    # a decodes first; b (still prefilling, admitted earlier) continues before c is admitted.
    assert ids(step(sched)) == [("a", 1), ("b", 7), ("c", 2)]
    assert ids(step(sched)) == [("a", 1), ("b", 1), ("c", 1)]


def test_token_budget_and_batch_size_are_never_exceeded(make_seq, kv_idle):
    rng = random.Random(0)
    sched = make_scheduler(max_batch_size=3, max_num_tokens=10)
    pending = [make_seq(f"r{i}", prompt_len=rng.randint(1, 32), max_tokens=rng.randint(1, 20)) for i in range(40)]
    done = 0
    while pending or sched.has_work():
        for _ in range(rng.randint(0, 2)):
            if pending:
                sched.add(pending.pop())
        batch = step(sched)
        assert sum(item.num_new_tokens for item in batch) <= 10
        assert len(batch) <= 3 and len(sched.running) <= 3
        done += sum(item.seq.status is SeqStatus.FINISHED for item in batch)
    assert done == 40
    kv_idle(sched.blocks)


def test_long_prompt_is_chunked_while_others_keep_decoding(make_seq):
    sched = make_scheduler(max_num_tokens=8, max_batch_size=2)
    short = make_seq("short", prompt_len=2, max_tokens=20)
    sched.add(short)
    step(sched)
    long = make_seq("long", prompt_len=30, max_tokens=4)
    sched.add(long)
    chunks = []
    while long.in_prefill or long.num_output_tokens == 0:
        before = short.num_output_tokens
        batch = step(sched)
        assert short.num_output_tokens == before + 1  # a decode token every step
        chunks.append(dict(ids(batch))["long"])
    assert chunks == [7, 7, 7, 7, 2]  # the budget minus short's decode token, then the rest
    assert long.num_output_tokens == 1  # it sampled only after its last chunk


def test_without_chunked_context_a_prompt_waits_for_a_whole_budget(make_seq):
    sched = make_scheduler(max_num_tokens=32, max_batch_size=2, enable_chunked_context=False)
    a, b = make_seq("a", prompt_len=20, max_tokens=4), make_seq("b", prompt_len=20, max_tokens=4)
    sched.add(a)
    sched.add(b)
    assert ids(step(sched)) == [("a", 20)]  # b does not fit in the 12 tokens left and is not cut
    assert ids(step(sched)) == [("a", 1), ("b", 20)]


def test_max_batch_size_is_respected(make_seq):
    sched = make_scheduler(max_batch_size=2, max_num_tokens=64)
    for i in range(5):
        sched.add(make_seq(f"r{i}", prompt_len=2, max_tokens=3))
    assert ids(step(sched)) == [("r0", 2), ("r1", 2)]
    assert [s.request_id for s in sched.waiting] == ["r2", "r3", "r4"]


def test_fcfs_head_request_is_not_overtaken(make_seq):
    # 16 blocks of 4 tokens: "big" needs 16 and waits until "first" (4 blocks) leaves; "small" would fit at once.
    sched = make_scheduler(max_seq_len=64, max_tokens_in_paged_kv_cache=64, max_batch_size=4, max_input_len=60)
    first = make_seq("first", prompt_len=8, max_tokens=8)
    sched.add(first)
    step(sched)
    sched.add(make_seq("big", prompt_len=60, max_tokens=4))
    sched.add(make_seq("small", prompt_len=2, max_tokens=2))
    while first.status is not SeqStatus.FINISHED:
        assert [s.request_id for s in sched.running] == ["first"]
        step(sched)
    step(sched)
    assert [s.request_id for s in sched.running][0] == "big"


def test_finish_frees_blocks_of_running_and_waiting_sequences(make_seq, kv_idle):
    sched = make_scheduler(max_batch_size=1)
    running, waiting = make_seq("running", prompt_len=10, max_tokens=10), make_seq("waiting")
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert running.block_table and sched.blocks.num_unreserved_free_blocks < sched.blocks.num_blocks
    sched.finish(running)
    sched.finish(waiting)
    assert not sched.has_work()
    kv_idle(sched.blocks)


def test_new_requests_join_while_others_are_mid_generation(make_seq):
    sched = make_scheduler(max_batch_size=4)
    early = [make_seq(f"early{i}", prompt_len=3, max_tokens=10) for i in range(2)]
    for seq in early:
        sched.add(seq)
    for _ in range(3):
        step(sched)
    late = make_seq("late", prompt_len=3, max_tokens=2)
    sched.add(late)
    batch = step(sched)
    assert "late" in dict(ids(batch)) and all(s.status is SeqStatus.RUNNING for s in early)
    step(sched)
    assert late.status is SeqStatus.FINISHED and all(s.status is SeqStatus.RUNNING for s in early)
    assert [s.request_id for s in sched.running] == ["early0", "early1"]


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    sched = make_scheduler(max_batch_size=1)
    order = [("low-1", 0), ("high-1", 5), ("low-2", 0), ("high-2", 5), ("mid", 2)]
    for rid, priority in order:
        sched.add(Sequence.from_request(Request(rid, (1, 2, 3), SamplingParams(max_tokens=1), priority=priority)))
    assert [s.request_id for s in sched.waiting] == ["high-1", "high-2", "mid", "low-1", "low-2"]


def test_priority_aging_serves_a_lower_tier_under_a_higher_tiers_overload():
    """The soak's starvation (perf/SOAK.md): a premium tier that keeps the one slot busy. Strict priority never
    admits the batch request; with aging it gains a level per period waited and is admitted once its aged level
    reaches premium's, ahead of premium requests that arrived after it."""
    clock = {"ns": 0}

    def run(aging_s):
        config = EngineConfig(max_batch_size=1, max_num_tokens=16, max_input_len=32, max_seq_len=64,
                              tokens_per_block=4, priority_aging_s=aging_s)
        sched = Scheduler(config, BlockManager(config.kv_cache_tokens // config.tokens_per_block, 4),
                          clock_ns=lambda: clock["ns"])
        clock["ns"] = 0

        def add(rid, priority):
            request = Request(rid, (1, 2, 3), SamplingParams(max_tokens=1), arrival_time_ns=clock["ns"],
                              priority=priority)
            sched.add(Sequence.from_request(request))

        add("batch", 0)
        served = []
        for i in range(12):  # one premium request arrives every second; each step serves one request
            clock["ns"] = i * 10**9
            add(f"premium-{i}", 2)
            served += [rid for rid, _ in ids(step(sched))]
        return served

    assert "batch" not in run(None)
    served = run(5.0)
    # At 10 s the batch request (waiting since 0) has aged by two levels to premium's, and arrived first.
    assert served.index("batch") == 10 and served[:10] == [f"premium-{i}" for i in range(10)], served


def test_preempted_sequences_stay_first_with_aging(make_seq):
    clock = {"ns": 0}
    config = EngineConfig(max_batch_size=4, max_num_tokens=16, max_input_len=32, max_seq_len=64, tokens_per_block=4,
                          priority_aging_s=1.0)
    sched = Scheduler(config, BlockManager(config.kv_cache_tokens // 4, 4), clock_ns=lambda: clock["ns"])
    old = Sequence.from_request(Request("old", (1, 2, 3), SamplingParams(max_tokens=4), arrival_time_ns=0,
                                        priority=9))
    back = Sequence.from_request(Request("back", (1, 2, 3), SamplingParams(max_tokens=4), arrival_time_ns=5 * 10**9))
    back.num_preemptions = 1
    sched.waiting.extend([old, back])
    clock["ns"] = 100 * 10**9
    sched._age_waiting()
    assert [s.request_id for s in sched.waiting] == ["back", "old"]


def test_priority_aging_must_be_positive():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        try:
            EngineConfig(priority_aging_s=bad)
        except ValueError as exc:
            assert "priority_aging_s" in str(exc)
        else:
            raise AssertionError(f"accepted priority_aging_s={bad}")
