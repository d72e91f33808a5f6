"""CallGate: at most `limit` callers inside at once, the others wait, and a caller that raises leaves its place."""
import threading
import time

import pytest

from backend.serving.bls_calls import DEFAULT_WAITING_CALLS, CallGate, call_gate
from backend.serving.parameters import ModelParameters


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2"])
def test_a_limit_that_is_not_a_positive_integer_is_refused(limit):
    with pytest.raises(ValueError, match="limit must be an integer >= 1"):
        CallGate(limit)


def test_the_default_leaves_half_of_python_backends_default_pool():
    assert CallGate().limit == DEFAULT_WAITING_CALLS == 16


class Inside:
    """Callers inside the gate, counted by the callers themselves."""

    def __init__(self) -> None:
        self.now, self.lock = 0, threading.Lock()

    def __enter__(self) -> int:
        with self.lock:
            self.now += 1
            return self.now

    def __exit__(self, *exc) -> None:
        with self.lock:
            self.now -= 1


def test_no_more_than_limit_callers_are_inside_and_the_rest_wait():
    gate, inside, release, most = CallGate(3), Inside(), threading.Event(), []
    entered = threading.Semaphore(0)

    def call() -> None:
        with gate.enter(), inside as now:
            most.append(now)
            entered.release()
            release.wait(10)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for _ in range(3):
        assert entered.acquire(timeout=5)
    assert not entered.acquire(timeout=0.2)  # the fourth waits while three are inside
    assert inside.now == 3
    release.set()
    for t in threads:
        t.join(10)
    assert len(most) == 8 and max(most) <= 3 and inside.now == 0


def test_a_caller_that_raises_leaves_its_place():
    gate, inside = CallGate(1), Inside()
    with pytest.raises(RuntimeError):
        with gate.enter(), inside:
            raise RuntimeError("exec failed")
    started = time.monotonic()
    with gate.enter(), inside as now:
        assert now == 1
    assert time.monotonic() - started < 1 and inside.now == 0


def test_the_limit_comes_from_the_bls_waiting_calls_parameter():
    assert call_gate(ModelParameters({})).limit == DEFAULT_WAITING_CALLS
    assert call_gate(ModelParameters({"bls_waiting_calls": "${bls_waiting_calls}"})).limit == DEFAULT_WAITING_CALLS
    assert call_gate(ModelParameters({"bls_waiting_calls": "40"})).limit == 40
    for bad, message in (("0", "must be an integer >= 1, got 0"), ("many", "must be an integer, got 'many'")):
        with pytest.raises(ValueError, match=f"parameter bls_waiting_calls {message}"):
            call_gate(ModelParameters({"bls_waiting_calls": bad}))
