"""A lock-order deadlock of Triton 2.51's Python backend in multi-threaded BLS streaming, and the protocol by which
our models stay out of it.

python_backend r24.10 (still so on its main branch; src/pb_stub.cc, src/pb_response_iterator.cc) takes three locks
in a cycle inside one stub process, when one thread calls a decoupled exec() while others iterate BLS streams:

- exec() returns the called model's first response, then registers its response iterator in the stub's map
  (`GetResponseIterator`): it takes the map's mutex **holding the GIL**;
- the stub's thread receiving BLS responses from the server process (`ProcessBLSResponseDecoupled`) holds the map's
  mutex while it pushes a response into its iterator: it takes **the iterator's mutex**;
- a thread iterating that stream (`ResponseIterator::Next`) that found no response waits with the GIL released and
  the iterator's mutex held around the wait; woken by a response, it takes **the GIL while holding the iterator's
  mutex**.

A second response for a stream arriving while its reader waits for the GIL, and an exec() of another thread in the
window, close the cycle: the stub's threads all stop for good (and so every stream through the model, the server's
in-flight count never reaching zero). Seen here in the canary router (a CI run of tests/integration/test_canary.py,
16 streams; `perf/probes/bls_deadlock.py` provokes it within minutes with two busy processes beside it), with the
stacks above in gdb.

No order of Python calls inside the stub avoids it (the reader waits inside the C++ call; exec() holds the GIL in
it). The cycle needs the receiving thread to be pushing a response while an exec() registers its iterator, and every
response after the first is pushed while the called model's send() is under way (send() returns once the caller's
stub took the response: the server process delivers it synchronously). So the exclusion is between the two
processes:

- a BLS caller holds `BlsExclusion` across each decoupled exec(), and asks the called model for an immediate empty
  first response (request parameter ACK_PARAMETER), so that an exec() holds it for a round trip, not until the first
  token;
- the called model sends a request's first response without the exclusion (for an ACK request: at once, waiting
  for nothing that needs the exclusion; the caller holds it), and every later response to an ACK request under it
  (`Reply`). tensorrt_llm answers a generation with the acknowledgement and a `stop` with its only response; the
  router, itself called by tensorrt_llm_bls in a canary repository, acknowledges before it calls tensorrt_llm.

While an exec() registers its iterator, then, no response is being pushed into the caller's stub, and the map's
mutex is free. One exclusion per server: a file lock named by the tritonserver process (every stub's parent) and the
user, plus a thread lock (flock does not exclude threads sharing one open file).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager, Iterator

ACK_PARAMETER = "tritonllm_bls_ack"  # request parameter (bool): answer at once with an empty non-final response


class BlsExclusion:
    """Exclusive across the processes opening `path` and across threads of this one. Its file stays open for the
    process's life (a model process's, or a test's)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # O_NOFOLLOW: a link planted at the name is refused; 0600: only this user's processes can hold the lock.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)


def exclusion_path(server_pid: int | None = None, folder: Path | None = None) -> Path:
    """The file every model of one tritonserver (the stubs' parent process) locks."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(folder or tempfile.gettempdir()) / f"tritonllm-bls-{os.getuid()}-{pid}.lock"


def remove_exclusion(server_pid: int, folder: Path | None = None) -> None:
    """Once tritonserver `server_pid` has exited, its exclusion's file goes (the launchers call this)."""
    exclusion_path(server_pid, folder).unlink(missing_ok=True)


def server_exclusion() -> BlsExclusion:
    """The exclusion shared by this server's models (call inside a model process, whose parent is tritonserver)."""
    return BlsExclusion(exclusion_path())


class Reply:
    """A request's response sender whose sends are made under `exclusion` (given for a BLS caller's request once its
    acknowledgement went out), then under the model's own `send_lock` (one send at a time, where the model has
    one). The exclusion first: an acknowledgement takes only the send lock, and must never wait behind a send that
    waits for the exclusion its caller holds."""

    def __init__(self, sender, send_lock: threading.Lock | None = None,
                 exclusion: BlsExclusion | None = None) -> None:
        self.sender = sender
        self.send_lock = send_lock
        self.exclusion = exclusion

    def send(self, response=None, flags: int = 0) -> None:
        with held(self.exclusion), (nullcontext() if self.send_lock is None else self.send_lock):
            self.sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


def held(exclusion: BlsExclusion | None) -> ContextManager[None]:
    """`exclusion.held()`, or nothing to hold (a request of no BLS caller)."""
    return nullcontext() if exclusion is None else exclusion.held()


def wants_ack(parameters: str | dict) -> bool:
    """True when a request's parameters (request.parameters()'s JSON, or parsed) ask for the immediate empty first
    response; anything but the JSON value true is no."""
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters) if parameters else {}
        except json.JSONDecodeError:
            return False
    return isinstance(parameters, dict) and parameters.get(ACK_PARAMETER) is True
