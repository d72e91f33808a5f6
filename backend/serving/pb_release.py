"""Where Triton 2.51's Python backend frees a model's pb_utils objects unsafely, and how our models keep it from
doing so: on a thread without the GIL, or after the model process's stub has been torn down.

python_backend r24.10 (src/pb_tensor.cc, src/response_sender.cc, src/pb_stub.cc, src/pb_response_iterator.cc)
frees an output tensor's numpy array wherever the tensor's last C++ owner goes, GIL or not; fixed upstream after
24.10 (python_backend #390: the tensor's destructor takes the GIL). Two such places reach our models
(router, tensorrt_llm_bls, tensorrt_llm), whose threads run Python meanwhile:

- a response sender's send() drops, without the GIL, the tensors the receiver did not ask for. `send_tensors`
  keeps the model's own references to every tensor until send() has returned, so the drop frees nothing;
- a decoupled exec()'s response iterator is also kept in a map of the stub, and the iterator keeps every
  response it yielded. After its last response it asks for that entry to be erased, which the stub's thread
  talking to the server process does, without the GIL, later. If the model had let go of the iterator first,
  that erase frees every response's arrays there. `BlsHold` keeps each finished iterator `hold_s` (30 s) longer,
  so the model's reference is the last and goes on a thread of the model.

Seen here before this: `*** Reference count error detected: an attempt was made to deallocate the dtype 5 (i) ***`
in the server log, then the router's process dying of `malloc_consolidate(): invalid chunk size` /
`malloc(): unaligned fastbin chunk detected` while tensorrt_llm versions were loaded under 16 streams with
cancelled ones among them (the erase waits behind the server process, which is slowest exactly then), and the
canary tests' in-flight requests hanging (Triton 2.51 does not notice a dead model process).

A third place: after finalize() the stub tears down its shared memory, then the interpreter's last garbage
collection frees what was left in reference cycles. A response sender freed there touches that shared memory
(seen here: every unload of tensorrt_llm ended in SIGSEGV in ~ResponseSender under Py_FinalizeEx, a core dump
showed). `release_at_finalize` drops a model's state and collects it at the end of its finalize(), before that.
"""
from __future__ import annotations

import collections
import gc
import threading
import time
from typing import Any, Callable


def send_tensors(pb_utils, sender, tensors: list, flags: int) -> None:
    """sender.send() of a response made of `tensors`; this frame holds them until the send returned."""
    sender.send(pb_utils.InferenceResponse(tensors), flags=flags)


def release_at_finalize(model: Any) -> None:
    """The last line of a model's finalize(): its attributes go, and whatever cycles held, now. Then every object
    left is frozen (gc.freeze): the interpreter's own collections at exit skip them. Those collections over torch's
    and transformers' objects took 1.4 of a model process's 1.7 s exit here; each model instance's process exits in
    turn, so they added seconds to every unload and server stop."""
    vars(model).clear()
    gc.collect()
    gc.freeze()


class BlsHold:
    """Finished BLS response iterators (anything), each released `hold_s` after it was handed over."""

    def __init__(self, hold_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if hold_s <= 0:
            raise ValueError(f"hold_s must be > 0, got {hold_s}")
        self.hold_s = hold_s
        self._clock = clock
        self._held: collections.deque[tuple[float, Any]] = collections.deque()  # (released at, iterator)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def keep(self, responses: Any) -> None:
        """Hold `responses`; let go of those whose time is up (on this thread: the caller holds the GIL)."""
        now = self._clock()
        due = []
        with self._lock:
            self._held.append((now + self.hold_s, responses))
            while self._held and self._held[0][0] <= now:
                due.append(self._held.popleft()[1])
        del due  # released here, outside the lock
