"""The engine's own thread: requests come in through a queue, outputs go out through each request's sink.

The Triton model (or any caller) never touches the engine directly: submit(), cancel() and shutdown() only
enqueue commands, so the engine is driven by exactly one thread and needs no locks. That thread can be given CPUs
of its own (engine_cpus, backend/serving/cpu_placement.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from backend.engine.interface import RequestOutput
from backend.engine.llm_engine import LLMEngine
from backend.engine.sequence import Request
from backend.engine.stats import EngineStats
from backend.errors import InvalidRequestError
from backend.serving.cpu_placement import format_cpu_list, pin_calling_thread

log = logging.getLogger(__name__)


class OutputSink(Protocol):
    """Where one request's results go (the Triton response sender, a test's queue...)."""

    def emit(self, output: RequestOutput) -> None: ...

    def fail(self, error: Exception) -> None: ...

    def cancelled(self) -> bool: ...


@dataclass(frozen=True)
class _Submit:
    request: Request
    sink: OutputSink


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True)
class _FailAll:
    error: Exception


_STOP = object()
_WAKE = object()  # no command: only makes an idle loop go round once (and publish its stats)


class EngineLoop:
    def __init__(self, engine: LLMEngine, cancel_check_period_s: float = 0.1,
                 on_stats: Callable[[EngineStats], None] | None = None, stats_period_s: float = 0.2,
                 cpus: frozenset[int] | None = None, idle_stats_period_s: float = 1.0) -> None:
        self.engine = engine
        self.cancel_check_period_s = cancel_check_period_s
        self.on_stats = on_stats
        self.stats_period_s = stats_period_s
        # An idle engine publishes again this often: a snapshot lost on its way (a metric update that failed) does
        # not leave the gauges stale until the next request.
        self.idle_stats_period_s = idle_stats_period_s
        self._last_stats = 0.0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, OutputSink] = {}
        self._last_cancel_check = 0.0
        self._inflight = 0  # submitted and not yet ended (any way); read by other threads
        self._inflight_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(cpus,), name="tritonllm-engine", daemon=True)
        self._pinned: queue.SimpleQueue = queue.SimpleQueue()  # the thread's placement: None, or why it failed
        self._thread.start()
        if (error := self._pinned.get()) is not None:
            self._thread.join()
            raise ValueError(f"engine_cpus {format_cpu_list(cpus)}: cannot run the engine thread there: {error}")

    def submit(self, request: Request, sink: OutputSink) -> None:
        self._count(+1)
        self._inbox.put(_Submit(request, sink))

    @property
    def inflight(self) -> int:
        """Requests submitted and not ended yet (queued in the inbox, waiting or running in the engine)."""
        return self._inflight

    def _count(self, delta: int) -> None:
        with self._inflight_lock:
            self._inflight += delta

    def fail_all(self, error: Exception) -> None:
        """End every request submitted so far with this error (a shutdown's grace period ended)."""
        self._inbox.put(_FailAll(error))

    def cancel(self, request_id: str) -> None:
        self._inbox.put(_Cancel(request_id))

    def wake(self) -> None:
        """Publish stats soon, also when idle: for counts made outside this thread (e.g. refused admissions)."""
        self._inbox.put(_WAKE)

    def shutdown(self, timeout: float = 30.0) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    def _run(self, cpus: frozenset[int] | None) -> None:
        try:
            if cpus is not None:  # before the first step: the OpenMP threads it starts inherit these CPUs
                pin_calling_thread(cpus)
        except OSError as exc:
            self._pinned.put(exc)
            return
        self._pinned.put(None)
        while True:
            idle = not self.engine.has_work()
            self._publish_stats(force=idle)
            # Block only when idle; while generating, drain what arrived and keep stepping.
            if not self._drain(block=idle):
                break
            self._check_cancelled()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug or an OOM must not hang clients: fail everyone in flight
                log.exception("engine step failed")
                self._fail_all(RuntimeError(f"engine step failed: {exc}"))
                continue
            for out in outputs:
                self._deliver(out)
        self._fail_all(RuntimeError("the engine is shutting down"))

    def _publish_stats(self, force: bool) -> None:
        """Hand a stats snapshot to on_stats every stats_period_s, and whenever the engine goes idle."""
        now = time.monotonic()
        if self.on_stats is None or (not force and now - self._last_stats < self.stats_period_s):
            return
        self._last_stats = now
        try:
            self.on_stats(self.engine.stats())
        except Exception:  # metrics must never stop generation
            log.exception("publishing engine stats failed")

    def _drain(self, block: bool) -> bool:
        """Apply queued commands (waiting up to idle_stats_period_s for one when block); False once shutdown was
        asked for."""
        try:
            cmd = self._inbox.get(timeout=self.idle_stats_period_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd is _STOP:
                return False
            self._apply(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: _Submit | _Cancel | _FailAll | object) -> None:
        if cmd is _WAKE:
            return
        if isinstance(cmd, _Cancel):
            self._abort(cmd.request_id)
            return
        if isinstance(cmd, _FailAll):
            self._fail_all(cmd.error)
            return
        try:
            self.engine.add_request(cmd.request)
        except InvalidRequestError as exc:
            self._count(-1)
            cmd.sink.fail(exc)
            return
        self._sinks[cmd.request.request_id] = cmd.sink

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort(request_id)
        if out is not None:
            self._deliver(out)

    def _check_cancelled(self) -> None:
        now = time.monotonic()
        if now - self._last_cancel_check < self.cancel_check_period_s:
            return
        self._last_cancel_check = now
        for request_id, sink in list(self._sinks.items()):
            if sink.cancelled():
                self._abort(request_id)

    def _deliver(self, out: RequestOutput) -> None:
        sink = self._sinks.get(out.request_id)
        if out.finished:
            self._forget(out.request_id)
        if sink is None:
            return
        if out.error is not None:  # this request alone failed in the engine's step
            sink.fail(RuntimeError(out.error))
            return
        try:
            sink.emit(out)
        except Exception as exc:  # a bug in this request's delivery: it alone ends, with an error
            log.exception("delivering output of %s failed; ending it with an error", out.request_id)
            self._end_undeliverable(out, sink, exc)

    def _end_undeliverable(self, out: RequestOutput, sink: OutputSink, exc: Exception) -> None:
        """The error is the request's end: its client must not wait for a final output that cannot come."""
        if not out.finished:  # stop it in the engine; its abort output is not delivered (the sink is forgotten)
            self._forget(out.request_id)
            self.engine.abort(out.request_id)
        try:
            sink.fail(RuntimeError(f"internal error delivering the output ({type(exc).__name__}; the log has it)"))
        except Exception:
            log.exception("failing %s failed", out.request_id)

    def _forget(self, request_id: str) -> None:
        """Drops the request's sink; it no longer counts as in flight."""
        if self._sinks.pop(request_id, None) is not None:
            self._count(-1)

    def _fail_all(self, error: Exception) -> None:
        for request_id, sink in list(self._sinks.items()):
            self.engine.abort(request_id)
            self._count(-1)
            try:
                sink.fail(error)
            except Exception:  # a client that went away must not keep the others from hearing
                log.exception("failing %s failed", request_id)
        self._sinks.clear()
