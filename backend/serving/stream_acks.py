"""How far the ensemble's postprocessing has got with each stream, told back to the tensorrt_llm model.

Why: in the ensemble every streamed response costs one postprocessing execution, ~1 ms of tritonserver and stub
time on a busy CPU whatever it holds (its Python, the detokenization, is ~0.04 ms). When responses come faster
than that, they queue in front of postprocessing (Triton's statistics: 270-316 ms on average at 16 streams of
the demo model on 2 cores, some streams' tokens all arriving at the end; perf/ISSUE16.md). Nothing in Triton 2.51
tells the tensorrt_llm model so (newer ensembles have max_inflight_requests). With these acks a stream's next
tokens wait in the tensorrt_llm model (RowStream) until postprocessing has taken its previous response, and go out
together: under load each execution carries several tokens; unloaded every token still goes out alone.

How: the tensorrt_llm model's process owns a small file in /dev/shm, one 64-bit stamp per slot, named by a random
62-bit key (not the process id: servers in separate PID namespaces may share /dev/shm); each streamed response
carries `stream_ack` = (the file's key, its row's slot, stamp), the stamp being the slot's generation (<< 32) and
the response's number in its stream. Postprocessing writes the stamp into the file once it has the response. A row
reads its slot: a stamp of another generation (a slot's earlier row) counts as nothing acked. A stream nobody acks
(a direct client, the BLS model) is never held; one whose acks stop is held at most HOLD_MAX_S. A client calling
postprocessing directly would have to guess a key to write a stamp (bounds checked); it can read nothing.
The owner holds an flock on its file while it lives: a file nobody locks is a dead process's, in any namespace.
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import secrets
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ACK_DIR = Path("/dev/shm")
SLOTS = 4096  # streamed rows at once per tensorrt_llm process; past that a row goes without acks (never held)
HOLD_MAX_S = 0.5  # a row waits at most this long for an ack (postprocessing stopped acking: a custom ensemble)
_SEQ_BITS = 32


def ack_path(key: int, directory: Path = ACK_DIR) -> Path:
    return directory / f"tritonllm-acks-{key:016x}"


class AckBoard:
    """The tensorrt_llm model's side: the file, and its slots lent to streamed rows (least recently freed first,
    so a late ack of a slot's earlier row rarely meets its next one)."""

    def __init__(self, slots: int = SLOTS, directory: Path = ACK_DIR) -> None:
        self.key = secrets.randbits(62) + 1  # > 0, and fits stream_ack's int64
        self.path = ack_path(self.key, directory)
        _remove_stale(directory)
        self._fd = _locked_file(self.path, 8 * slots)
        self.stamps = np.memmap(self.path, dtype=np.uint64, mode="r+", shape=(slots,))
        self._free = collections.deque(range(slots))
        self._generation = [0] * slots

    def lease(self) -> AckSlot | None:
        """A slot for one streamed row, or None when all are taken (that row is then never held)."""
        try:
            slot = self._free.popleft()
        except IndexError:
            return None
        self._generation[slot] = (self._generation[slot] + 1) % (1 << 31)
        return AckSlot(self, slot, self._generation[slot])

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        del self.stamps
        self.path.unlink(missing_ok=True)
        os.close(self._fd)


def _locked_file(path: Path, size: int) -> int:
    """Makes the zeroed file under a hidden name, locks it, then gives it its name: no other board's clean-up can
    see it unlocked. The lock lasts while the returned descriptor is open (the process's life)."""
    hidden = path.with_name(f".{path.name}")
    fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, size)
        os.rename(hidden, path)
    except OSError:
        os.close(fd)
        hidden.unlink(missing_ok=True)
        raise
    return fd


def _remove_stale(directory: Path) -> None:
    """Files of processes that are gone (a killed stub never unlinks its own): 32 KB each, left to pile up else.
    A file whose lock can be taken has no owner."""
    for path in directory.glob("tritonllm-acks-*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile, or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
        except OSError:  # locked: its owner lives
            pass
        finally:
            os.close(fd)


def open_board(slots: int = SLOTS, directory: Path = ACK_DIR) -> AckBoard | None:
    """An AckBoard, or None where its file cannot be made (rows are then never held for postprocessing)."""
    try:
        return AckBoard(slots, directory)
    except OSError as exc:
        log.warning("streamed responses go without postprocessing acks: %s", exc)
        return None


class AckSlot:
    """One streamed row's slot: the `stream_ack` of its n-th response, and how many of them postprocessing took."""

    def __init__(self, board: AckBoard, slot: int, generation: int) -> None:
        self.board = board
        self.slot = slot
        self.generation = generation
        self.released = False

    def stamp(self, seq: int) -> np.ndarray:
        """(1, 3) int64: the `stream_ack` output of this row's response number seq (from 1)."""
        return np.array([[self.board.key, self.slot, (self.generation << _SEQ_BITS) | seq]], dtype=np.int64)

    def acked(self) -> int:
        """The number of this row's last response postprocessing took; 0 if none (or nobody acks this row)."""
        stamp = int(self.board.stamps[self.slot])
        return stamp & ((1 << _SEQ_BITS) - 1) if stamp >> _SEQ_BITS == self.generation else 0

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.board.release(self.slot)


class AckWriter:
    """Postprocessing's side: writes each response's stamp into its tensorrt_llm process's file."""

    def __init__(self, directory: Path = ACK_DIR) -> None:
        self.directory = directory
        self._boards: dict[int, np.memmap] = {}

    def ack(self, acks: np.ndarray) -> None:
        """acks: (B, 3) int64, each row a `stream_ack`. Rows naming no file or slot are skipped."""
        for key, slot, stamp in np.asarray(acks, dtype=np.int64).reshape(-1, 3).tolist():
            stamps = self._board(key)
            if stamps is not None and 0 <= slot < stamps.shape[0] and stamp >= 0:
                stamps[slot] = stamp

    def _board(self, key: int) -> np.memmap | None:
        """The file of that key, opened once (each tensorrt_llm process makes its file before it answers)."""
        if key in self._boards:
            return self._boards[key]
        if key <= 0:
            return None
        try:
            stamps = np.memmap(ack_path(key, self.directory), dtype=np.uint64, mode="r+")
        except (OSError, ValueError):  # no such file (a made-up key, or its process is gone), or an empty one
            return None  # not remembered: made-up keys must not grow this dict
        self._boards[key] = stamps
        return stamps
