"""SendQueue: responses sent in order from one background thread, bounded, failures reported per send."""
from __future__ import annotations

import threading
import time

import pytest

from backend.serving.send_queue import SendQueue

TIMEOUT_S = 30.0


def test_sends_run_in_submission_order_off_the_callers_thread():
    sends, seen, callers = SendQueue(), [], set()
    for i in range(200):
        sends.submit(lambda i=i: (seen.append(i), callers.add(threading.current_thread().name)), lambda exc: None)
    sends.close(TIMEOUT_S)
    assert seen == list(range(200))
    assert callers == {"tritonllm-send"}
    assert sends.pending == 0


def test_the_caller_does_not_wait_for_a_slow_send():
    sends, release = SendQueue(), threading.Event()
    sends.submit(lambda: release.wait(TIMEOUT_S), lambda exc: None)
    started = time.monotonic()
    sends.submit(lambda: None, lambda exc: None)
    assert time.monotonic() - started < 1.0  # queued behind the blocked send, not run inline
    assert sends.pending == 2
    release.set()
    sends.close(TIMEOUT_S)
    assert sends.pending == 0


def test_a_full_queue_blocks_the_caller_until_the_sender_catches_up():
    sends, release = SendQueue(max_pending=1), threading.Event()
    sends.submit(lambda: release.wait(TIMEOUT_S), lambda exc: None)  # taken by the thread, blocked there
    sends.submit(lambda: None, lambda exc: None)  # fills the queue
    third = threading.Thread(target=sends.submit, args=(lambda: None, lambda exc: None))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # backpressure: memory stays bounded while the sender is stuck
    release.set()
    third.join(TIMEOUT_S)
    assert not third.is_alive()
    sends.close(TIMEOUT_S)


def test_a_failing_send_is_reported_to_its_own_callback_and_the_others_go_on():
    sends, errors, seen = SendQueue(), [], []

    def broken():
        raise RuntimeError("client went away")

    sends.submit(lambda: seen.append(1), lambda exc: errors.append(("first", exc)))
    sends.submit(broken, lambda exc: errors.append(("broken", exc)))
    sends.submit(lambda: seen.append(3), lambda exc: errors.append(("third", exc)))
    sends.close(TIMEOUT_S)
    assert seen == [1, 3]
    assert [(name, str(exc)) for name, exc in errors] == [("broken", "client went away")]


def test_after_close_sends_run_inline():
    sends, seen = SendQueue(), []
    sends.close(TIMEOUT_S)
    sends.submit(lambda: seen.append(threading.current_thread().name), lambda exc: None)
    assert seen == [threading.current_thread().name]


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError, match="max_pending"):
        SendQueue(max_pending=0)


def test_close_gives_up_on_a_stuck_send_and_drops_the_rest_instead_of_hanging():
    """A send whose round trip never ends (the Triton process is gone) must not hang the model's finalize."""
    sends, never, seen = SendQueue(), threading.Event(), []
    sends.submit(lambda: never.wait(), lambda exc: None)
    sends.submit(lambda: seen.append("queued"), lambda exc: None)
    started = time.monotonic()
    sends.close(timeout=0.2)
    assert time.monotonic() - started < 5.0
    sends.submit(lambda: seen.append("late"), lambda exc: None)  # dropped, not run inline (it would hang too)
    assert seen == []
    never.set()
