"""Asking Triton whether a client cancelled, off the engine thread and not once per token.

In the Python backend, `is_cancelled()` (a response sender's or a request's) is a round trip to the Triton server
process: 0.42 ms measured with 16 streams of the demo model on 2 cores (perf/ISSUE16.md). Polled from the engine
thread for every request every 0.1 s it cost 2.1 ms of each 41 ms step; asked by postprocessing for every streamed
token, one round trip per token.

- CancelWatch: every `period_s` its thread has each watched request's probe asked -- through `run`, which the
  tensorrt_llm model points at its SendQueue, so that polls and sends are one sequence on one thread -- and keeps
  the answer in a flag that the engine thread reads for free (EngineLoop still checks its sinks every cancellation
  period: a cancel is seen within two periods). A request is finished (never asked again) by the send of its final
  response, on that same thread: Triton 2.51 crashes (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled, seen in
  CI) when is_cancelled() is asked after the request's final response freed its response factory.
- CancelPolls: tells a per-token caller whether a key's poll is due (at most once per `period_s` per key).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Hashable

log = logging.getLogger(__name__)


class Watched:
    """One request's cancellation flag, written by the watch thread, read by anyone."""

    def __init__(self, probe: Callable[[], bool]) -> None:
        self.probe = probe
        self.cancelled = False
        self.done = False  # the request ended: the watch forgets it

    def finish(self) -> None:
        self.done = True


class CancelWatch:
    def __init__(self, period_s: float, run: Callable[[Callable[[], None]], None] | None = None,
                 name: str = "tritonllm-cancel-watch") -> None:
        """run(poll): where a pass of polls runs (default: on the watch's own thread)."""
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._run_poll = run or (lambda poll: poll())
        self._poll_queued = False  # a pass handed to `run` and not done yet: the next period skips
        self._watched: list[Watched] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, probe: Callable[[], bool]) -> Watched:
        watched = Watched(probe)
        with self._lock:
            self._watched.append(watched)
        return watched

    @property
    def size(self) -> int:
        return len(self._watched)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if self._poll_queued:
                continue
            self._poll_queued = True
            try:
                self._run_poll(self.poll)
            except Exception:
                self._poll_queued = False
                log.exception("scheduling a cancellation poll failed")

    def poll(self) -> None:
        """One pass: forget ended requests, ask the others (a probe that raises counts as cancelled: its client
        can no longer be reached)."""
        self._poll_queued = False
        with self._lock:
            self._watched = [w for w in self._watched if not w.done]
            watched = list(self._watched)
        for w in watched:
            if w.cancelled or w.done:
                continue
            try:
                w.cancelled = bool(w.probe())
            except Exception:
                log.exception("asking whether a request was cancelled failed; cancelling it")
                w.cancelled = True


class CancelPolls:
    """Whether a key's cancellation poll is due: the first time, then at most once per `period_s`."""

    def __init__(self, period_s: float, max_keys: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        if period_s < 0:
            raise ValueError(f"period_s must be >= 0, got {period_s}")
        self.period_s = period_s
        self.max_keys = max_keys
        self.clock = clock
        self._last: OrderedDict[Hashable, float] = OrderedDict()

    def due(self, key: Hashable) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.period_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        return True

    def forget(self, key: Hashable) -> None:
        self._last.pop(key, None)
