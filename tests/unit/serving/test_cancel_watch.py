"""CancelWatch polls is_cancelled off the engine thread; CancelPolls spaces a per-token caller's polls."""
from __future__ import annotations

import threading

import pytest

from backend.serving.cancel_watch import CancelPolls, CancelWatch


class Probe:
    def __init__(self, answer: bool = False) -> None:
        self.answer = answer
        self.calls = 0
        self.threads: set[str] = set()

    def __call__(self) -> bool:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        return self.answer


def test_a_cancel_is_seen_by_the_flag_after_a_poll_from_the_watch_thread():
    watch = CancelWatch(period_s=3600)  # polled by hand below; the thread sleeps
    try:
        probe = Probe()
        watched = watch.watch(probe)
        watch.poll()
        assert not watched.cancelled and probe.calls == 1
        probe.answer = True
        watch.poll()
        assert watched.cancelled
        watch.poll()
        assert probe.calls == 2  # a cancelled request is not asked again
    finally:
        watch.close()


def test_the_thread_polls_every_period():
    watch = CancelWatch(period_s=0.01)
    try:
        probe = Probe(answer=True)
        watched = watch.watch(probe)
        for _ in range(500):
            if watched.cancelled:
                break
            threading.Event().wait(0.01)
        assert watched.cancelled and probe.threads == {"tritonllm-cancel-watch"}
    finally:
        watch.close()


def test_finished_requests_are_forgotten_and_not_asked():
    watch = CancelWatch(period_s=3600)
    try:
        done, live = Probe(), Probe()
        watch.watch(done).finish()
        watch.watch(live)
        watch.poll()
        assert done.calls == 0 and live.calls == 1 and watch.size == 1
    finally:
        watch.close()


def test_a_probe_that_raises_counts_as_cancelled_and_the_others_are_still_asked():
    watch = CancelWatch(period_s=3600)
    try:
        def gone():
            raise RuntimeError("request released")

        broken, other = watch.watch(gone), Probe()
        watched_other = watch.watch(other)
        watch.poll()
        assert broken.cancelled and not watched_other.cancelled and other.calls == 1
    finally:
        watch.close()


def test_period_must_be_positive():
    with pytest.raises(ValueError, match="period_s"):
        CancelWatch(period_s=0)


def test_polls_are_due_once_per_period_per_key():
    now = [0.0]
    polls = CancelPolls(period_s=0.1, clock=lambda: now[0])
    assert polls.due("a") and polls.due("b")
    assert not polls.due("a")
    now[0] = 0.05
    assert not polls.due("a")
    now[0] = 0.11
    assert polls.due("a") and not polls.due("a")
    polls.forget("a")
    assert polls.due("a")


def test_polls_remember_a_bounded_number_of_keys():
    polls = CancelPolls(period_s=100, max_keys=3, clock=lambda: 0.0)
    for key in range(5):
        assert polls.due(key)
    assert not polls.due(4) and polls.due(0)  # 0 was the oldest: forgotten, due again


def test_passes_run_where_run_puts_them_and_one_at_a_time():
    """The model hands each pass to its send thread (no poll may follow a request's final send): the watch thread
    only schedules, and schedules no second pass while one waits."""
    handed: list = []
    watch = CancelWatch(period_s=0.01, run=handed.append)
    try:
        probe = Probe(answer=True)
        watched = watch.watch(probe)
        for _ in range(500):
            if handed:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.1)  # several periods: still one pass waiting
        assert len(handed) == 1 and probe.calls == 0 and not watched.cancelled
        handed.pop()()  # the send thread runs it
        assert watched.cancelled and probe.threads == {threading.current_thread().name}
        for _ in range(500):  # the next pass is scheduled once this one ran
            if handed:
                break
            threading.Event().wait(0.01)
        assert len(handed) == 1
    finally:
        watch.close()
