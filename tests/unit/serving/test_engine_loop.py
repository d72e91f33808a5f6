"""EngineLoop: the engine's own thread, fed through submit/cancel/shutdown, results out through sinks."""
from __future__ import annotations

import os
import queue
import threading

import pytest

from backend.engine.interface import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Request
from backend.errors import InvalidRequestError, UnavailableError
from backend.serving.engine_loop import EngineLoop

TIMEOUT_S = 30.0


class QueueSink:
    """An OutputSink that puts everything it receives on a queue; the hooks let a test act at a given output."""

    def __init__(self, on_emit=None) -> None:
        self.events: queue.Queue = queue.Queue()
        self.on_emit = on_emit
        self.cancel_flag = False

    def emit(self, output: RequestOutput) -> None:
        self.events.put(output)
        if self.on_emit is not None:
            self.on_emit(self, output)

    def fail(self, error: Exception) -> None:
        self.events.put(error)

    def cancelled(self) -> bool:
        return self.cancel_flag

    def collect(self) -> tuple[list[int], RequestOutput | Exception]:
        """Block until the request ends: (all its tokens, its last output or the error it failed with)."""
        tokens: list[int] = []
        while True:
            event = self.events.get(timeout=TIMEOUT_S)
            if isinstance(event, Exception):
                return tokens, event
            tokens.extend(event.new_token_ids)
            if event.finished:
                return tokens, event


@pytest.fixture
def engine(make_engine):
    return make_engine(max_batch_size=4, max_num_tokens=16, tokens_per_block=4)


@pytest.fixture
def loop(engine):
    loop = EngineLoop(engine, cancel_check_period_s=0.0)
    yield loop
    loop.shutdown()


@pytest.fixture
def reference(make_engine):
    """request -> its output tokens from LLMEngine.generate on a fresh engine (same checkpoint and limits)."""

    def generate(requests: list[Request]) -> dict[str, list[int]]:
        return make_engine(max_batch_size=4, max_num_tokens=16, tokens_per_block=4).generate(requests)

    return generate


def make_requests(prompts, vocab_size: int, n: int) -> list[Request]:
    ps = prompts([3 + 5 * i for i in range(n)], vocab_size, seed=11)
    return [Request(f"r{i}", p, SamplingParams(max_tokens=4 + i % 5, temperature=0.8, top_k=30, seed=i))
            for i, p in enumerate(ps)]


def test_many_requests_all_finish_with_the_engines_tokens(loop, engine, prompts, reference, kv_idle):
    requests = make_requests(prompts, engine.vocab_size, 10)
    sinks = {r.request_id: QueueSink() for r in requests}
    for r in requests:
        loop.submit(r, sinks[r.request_id])
    results = {rid: sink.collect() for rid, sink in sinks.items()}
    expected = reference(requests)
    for r in requests:
        tokens, last = results[r.request_id]
        assert tokens == expected[r.request_id]
        assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == r.sampling.max_tokens
    loop.shutdown()
    kv_idle(engine.blocks)


def test_cancel_mid_generation_frees_its_blocks_while_the_others_complete(loop, engine, prompts, reference, kv_idle):
    requests = make_requests(prompts, engine.vocab_size, 3)
    long = Request("long", prompts([20], engine.vocab_size, seed=12)[0], SamplingParams(max_tokens=100))

    def cancel_at_first_token(sink: QueueSink, out: RequestOutput) -> None:
        if out.num_output_tokens == 1:
            loop.cancel("long")  # the engine thread is inside emit: applied before its next step

    sinks = {r.request_id: QueueSink() for r in requests} | {"long": QueueSink(cancel_at_first_token)}
    loop.submit(long, sinks["long"])
    for r in requests:
        loop.submit(r, sinks[r.request_id])
    tokens, last = sinks["long"].collect()
    assert last.finish_reason is FinishReason.CANCELLED and last.finished
    assert len(tokens) == 1 and last.num_output_tokens == 1
    expected = reference(requests)
    assert {r.request_id: sinks[r.request_id].collect()[0] for r in requests} == expected
    loop.shutdown()
    kv_idle(engine.blocks)


def test_a_sink_that_reports_cancelled_is_aborted(loop, engine, prompts, kv_idle):
    def client_goes_away(sink: QueueSink, out: RequestOutput) -> None:
        sink.cancel_flag = out.num_output_tokens >= 2

    sink = QueueSink(client_goes_away)
    loop.submit(Request("gone", prompts([5], engine.vocab_size)[0], SamplingParams(max_tokens=100)), sink)
    tokens, last = sink.collect()
    assert last.finish_reason is FinishReason.CANCELLED and len(tokens) == 2
    loop.shutdown()
    kv_idle(engine.blocks)


@pytest.mark.parametrize("at", [1, 3])  # a middle output; the last one (max_tokens 3)
def test_a_sink_whose_emit_raises_ends_that_request_with_an_error_and_the_others_finish(loop, engine, prompts,
                                                                                          kv_idle, at):
    """A bug in one request's delivery must not leave its client waiting for an end that never comes."""

    class BrokenSink(QueueSink):
        def emit(self, output: RequestOutput) -> None:
            if output.num_output_tokens == at:
                raise ValueError("broken delivery")
            super().emit(output)

    bad, good = BrokenSink(), QueueSink()
    p_bad, p_good = prompts([5, 6], engine.vocab_size)
    loop.submit(Request("bad", p_bad, SamplingParams(max_tokens=3)), bad)
    loop.submit(Request("good", p_good, SamplingParams(max_tokens=6)), good)
    tokens, error = bad.collect()
    assert isinstance(error, RuntimeError) and "ValueError" in str(error) and len(tokens) == at - 1
    assert bad.events.empty()  # the error is its one end
    tokens, last = good.collect()
    assert len(tokens) == 6 and last.finish_reason is FinishReason.LENGTH
    loop.shutdown()
    assert loop.inflight == 0
    kv_idle(engine.blocks)


def test_invalid_request_fails_its_sink_only(loop, engine, prompts):
    bad, good = QueueSink(), QueueSink()
    loop.submit(Request("bad", (1, engine.vocab_size), SamplingParams(max_tokens=4)), bad)
    loop.submit(Request("good", prompts([4], engine.vocab_size)[0], SamplingParams(max_tokens=4)), good)
    tokens, error = bad.collect()
    assert tokens == [] and isinstance(error, InvalidRequestError) and "outside the vocabulary" in str(error)
    tokens, last = good.collect()
    assert len(tokens) == 4 and last.finish_reason is FinishReason.LENGTH


def test_shutdown_fails_requests_in_flight_and_joins(engine, prompts):
    loop = EngineLoop(engine)
    started, release = threading.Event(), threading.Event()

    def hold_the_engine_thread(sink: QueueSink, out: RequestOutput) -> None:
        started.set()
        release.wait(TIMEOUT_S)

    sink = QueueSink(hold_the_engine_thread)
    loop.submit(Request("busy", prompts([5], engine.vocab_size)[0], SamplingParams(max_tokens=100)), sink)
    assert started.wait(TIMEOUT_S)
    threading.Timer(0.2, release.set).start()  # after shutdown() has queued its sentinel
    loop.shutdown(timeout=TIMEOUT_S)
    assert not any(t.name == "tritonllm-engine" and t.is_alive() for t in threading.enumerate())
    tokens, error = sink.collect()
    assert len(tokens) == 1 and isinstance(error, RuntimeError) and "shutting down" in str(error)
    assert not engine.has_work()


def test_wake_publishes_stats_of_an_idle_engine(engine):
    """Counts made outside the engine thread (refused admissions) reach the metrics without any request: wake()
    makes the idle loop publish once more, from its own thread."""
    published: queue.Queue = queue.Queue()
    loop = EngineLoop(engine, on_stats=lambda stats: published.put(threading.current_thread().name))
    try:
        assert published.get(timeout=TIMEOUT_S) == "tritonllm-engine"  # idle at start: published once, then waits
        assert published.empty()
        loop.wake()
        assert published.get(timeout=TIMEOUT_S) == "tritonllm-engine"
    finally:
        loop.shutdown()


def test_an_idle_engine_publishes_its_stats_again_and_again(engine):
    """A snapshot lost on its way to the metrics (an update that failed) must not leave the gauges stale while the
    engine waits for requests: the idle loop publishes every idle_stats_period_s without steps."""
    published: queue.Queue = queue.Queue()
    loop = EngineLoop(engine, on_stats=lambda stats: published.put(stats), idle_stats_period_s=0.05)
    try:
        snapshots = [published.get(timeout=TIMEOUT_S) for _ in range(4)]
        assert {s.free_blocks for s in snapshots} == {engine.blocks.num_blocks}
        assert engine.iterations == 0  # published, not stepped
    finally:
        loop.shutdown()


def test_inflight_counts_requests_until_they_end_and_fail_all_ends_the_rest(loop, prompts):
    """What the launcher's drain reads (EngineLoop.inflight), and the end of a shutdown's grace period."""
    short = QueueSink()
    # The long request ends the grace period itself, at its first token: no race with the engine thread.
    long = QueueSink(on_emit=lambda sink, out: loop.fail_all(UnavailableError("the grace period ended")))
    [p1, p2] = prompts([5, 6], vocab_size=64)
    loop.submit(Request("short", p1, SamplingParams(max_tokens=1)), short)
    loop.submit(Request("long", p2, SamplingParams(max_tokens=150)), long)
    assert loop.inflight == 2
    assert short.collect()[1].finished
    tokens, error = long.collect()
    assert isinstance(error, UnavailableError) and "grace period" in str(error) and len(tokens) < 150
    assert loop.inflight == 0
    refused = QueueSink()
    loop.submit(Request("bad", p1, SamplingParams(max_tokens=10_000)), refused)  # over max_seq_len: refused
    assert isinstance(refused.collect()[1], InvalidRequestError)
    assert loop.inflight == 0


def test_the_engine_thread_runs_on_its_cpus_and_the_caller_keeps_its_own(engine):
    """engine_cpus: the loop's thread pins itself before its first step (backend/serving/cpu_placement.py)."""
    caller = os.sched_getaffinity(0)
    mine = frozenset({max(caller)})
    seen: queue.Queue = queue.Queue()
    loop = EngineLoop(engine, on_stats=lambda stats: seen.put(os.sched_getaffinity(0)), cpus=mine)
    try:
        assert seen.get(timeout=TIMEOUT_S) == mine
        assert os.sched_getaffinity(0) == caller
    finally:
        loop.shutdown()


def test_cpus_the_thread_cannot_run_on_fail_the_loop_at_start(engine):
    missing = frozenset({os.cpu_count() + 7})
    with pytest.raises(ValueError, match=f"engine_cpus {min(missing)}: cannot run the engine thread there"):
        EngineLoop(engine, cpus=missing)
