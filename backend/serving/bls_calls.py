"""How many of a model's BLS calls may wait for the called model at once.

python_backend r24.10 (src/python_be.cc, ExecuteBLSRequest) serves each exec() of a model instance on a thread of
one pool in the server process (`--backend-config=python,thread-pool-size=N`, 32 by default) that blocks until the
called model's first response (decoupled) or its only one (unary). The same pool carries the model's response sends
and its other BLS calls. Our BLS models (router, tensorrt_llm_bls) call from one thread per request, outside their
send lock, so with more requests than the engine has slots, every waiting call holds a pool thread: once the pool is
all waiting calls, no stream's token is sent and no `stop` of a cancelled stream (a BLS call too) reaches the engine
to make room, until some stream runs to its end.

`CallGate` lets at most `limit` generation calls wait at once (16: half the default pool, the rest left to sends,
stops and readiness checks); the others wait in their own Python thread, which holds nothing in the server process.
A `stop` does not pass the gate: it is answered at once and is what frees a slot. The models' config.pbtxt parameter
`bls_waiting_calls` sets the limit (raise it with the pool's thread-pool-size: in unary mode a call waits for its
whole generation, so the limit is also how many unary requests a BLS model has in the engine at once).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from backend.serving.parameters import ModelParameters

DEFAULT_WAITING_CALLS = 16
PARAMETER = "bls_waiting_calls"


class CallGate:
    """A bound on the calls inside `enter()` at once; the rest wait their turn (FIFO is not promised)."""

    def __init__(self, limit: int = DEFAULT_WAITING_CALLS) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    @contextmanager
    def enter(self) -> Iterator[None]:
        with self._slots:
            yield


def call_gate(params: ModelParameters) -> CallGate:
    """The gate of a BLS model, its limit from the `bls_waiting_calls` parameter (unset: DEFAULT_WAITING_CALLS)."""
    limit = params.integer(PARAMETER, DEFAULT_WAITING_CALLS)
    if limit < 1:
        raise ValueError(f"parameter {PARAMETER} must be an integer >= 1, got {limit}")
    return CallGate(limit)
