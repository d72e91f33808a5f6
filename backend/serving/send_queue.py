"""Responses sent from one background thread, in order, so that the engine thread never waits on Triton's IPC.

A Python-backend response sender's send() is a round trip to the Triton server process, paid once per streamed
token: measured 0.46 ms a send with 16 streams of the demo model on 2 cores (perf/ISSUE16.md), 7 ms of a 48 ms
served step during which the engine thread computed nothing. Queued here, a step's sends run while the engine
computes the next step.

Order: one thread, first in first out, so a request's responses keep the order they were made in (its FINAL one
last). Bounded: when `max_pending` sends wait, submit() blocks the engine thread until the sender catches up, so a
slow client side slows generation instead of growing memory. A send that raises (the client went away) is logged
and reported to its `on_error`, which cancels that request only. After close(), submit() sends inline (responses
of requests failed during unload still go out), unless the send thread is stuck in a send whose round trip never
ends (the Triton process is gone): then close() returns after its timeout and the rest are dropped, so that the
model's finalize, and its process, still end.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger(__name__)

_CLOSE = object()


class SendQueue:
    def __init__(self, max_pending: int = 1024, name: str = "tritonllm-send") -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._pending = 0  # submitted and not yet sent; read by other threads (the launcher's drain)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Sends queued or in progress: a request is not over for its client before its final one is sent."""
        return self._pending

    def submit(self, send: Callable[[], None], on_error: Callable[[Exception], None]) -> None:
        if self._closed:
            if self._thread.is_alive():  # stuck in a send: the Triton process no longer answers
                log.error("a response was dropped: the send thread is stuck (is the Triton process gone?)")
            else:
                _call(send, on_error)
            return
        with self._lock:
            self._pending += 1
        self._queue.put((send, on_error))

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued, then stop the thread; later submits send inline."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_CLOSE)
        self._thread.join(timeout)
        if self._thread.is_alive():
            # A send that never returns (its round trip waits without a timeout: the Triton process is gone). Sending
            # the rest from here would hang this caller -- the model's finalize -- too, and the process would outlive
            # its server: drop them.
            log.error("%d responses not sent: the send thread is stuck (is the Triton process gone?)", self._pending)
            return
        while True:  # a submit that raced close() put its send behind the sentinel
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _CLOSE:
                self._send(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                return
            self._send(item)

    def _send(self, item: tuple[Callable[[], None], Callable[[Exception], None]]) -> None:
        try:
            _call(*item)
        finally:
            with self._lock:
                self._pending -= 1


def _call(send: Callable[[], None], on_error: Callable[[Exception], None]) -> None:
    try:
        send()
    except Exception as exc:  # one client's failure must not stop the others' responses
        log.exception("sending a response failed")
        try:
            on_error(exc)
        except Exception:
            log.exception("reporting a failed send failed")
