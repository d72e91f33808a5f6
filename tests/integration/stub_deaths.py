"""A test's watch on the model processes of a tritonserver it started without the supervisor.

Triton 2.51 neither notices nor reports a Python-backend stub that dies (ensembles/stub_watch.py): the dead model's
in-flight requests hang. A test blocked on those responses would wait for pytest's timeout and report a hang; with
this watch it stops within a second or two of the death and names the model process that died.
"""
from __future__ import annotations

import queue
import threading

from ensembles.stub_watch import StubWatch


class StubDied(RuntimeError):
    """A model process of the server under test died on its own."""


class StubDeaths:
    """Polls the server's stubs every `period_s` from a thread of its own until closed."""

    def __init__(self, server_pid: int, period_s: float = 0.5) -> None:
        self._watch = StubWatch(server_pid)
        self._period_s = period_s
        self._died: list[str] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="stub-deaths", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._closed.wait(self._period_s):
            dead = self._watch.dead()
            if dead:
                self._died[:] = dead
                return

    @property
    def died(self) -> list[str]:
        return list(self._died)

    def check(self) -> None:
        """Raise StubDied naming the dead model processes, if any."""
        if self._died:
            raise StubDied("; ".join(self._died) + " (Triton 2.51 leaves its requests hanging)")

    def get(self, responses: queue.Queue, timeout_s: float):
        """responses.get(timeout=timeout_s), in slices of the poll period, raising StubDied as soon as one died."""
        waited = 0.0
        while True:
            self.check()
            try:
                return responses.get(timeout=self._period_s)
            except queue.Empty:
                waited += self._period_s
                if waited >= timeout_s:
                    raise

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
