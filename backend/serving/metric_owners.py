"""Whether another live process serves the same model version: then this one's metrics are not deleted at its end.

Why: Triton 2.51 gives two copies of a model version (the copy a reload loads while the old one still serves, then
unloads) the same Prometheus metric for the same family name and labels, but counts references per copy (core
src/metric_family.cc: a reference count per MetricFamily object, each copy having its own). The first copy to
delete its metrics frees the metric the other copy goes on writing: heap corruption in tritonserver (seen here:
`load ensemble` after an unload, then the stop: two model processes aborting with "unaligned tcache chunk
detected", two models never unloaded, the stop waiting out its 30 s exit timeout; with the old copy's metrics kept,
none). A copy that ends while another copy of its version lives leaves its metrics to that one (never deleted, not
even at its process's exit: `keep_forever`); the last copy deletes them.

How: each copy holds an flock on a file in /dev/shm named after the version's folder (its model repository, name
and version) plus a random suffix; at the end it asks whether any other such file is locked. A file nobody locks
is a dead process's, removed then. Different versions have different labels (model, version): no sharing. Where
the file cannot be made, another copy may live for all this copy knows: its metrics are kept.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_DIR = Path("/dev/shm")
_KEPT: list[object] = []  # objects never to be freed (keep_forever); the list itself holds an extra reference


class MetricOwners:
    def __init__(self, model_dir: str | Path, version: str | int, directory: Path = LOCK_DIR) -> None:
        digest = hashlib.sha1(f"{Path(model_dir).resolve()}\0{version}".encode()).hexdigest()[:16]
        self.directory = directory
        self.prefix = f"tritonllm-metrics-{digest}-"
        self.path = directory / f"{self.prefix}{secrets.token_hex(8)}"
        self._fd: int | None = None
        try:
            self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh random name: never held by another
        except OSError as exc:
            log.warning("metrics are kept at this model's end (another copy may share them): %s", exc)

    def others_alive(self) -> bool:
        """Whether another live process holds this version's metrics too (removes dead processes' files); True when
        this copy could not make its own file (it cannot know)."""
        if self._fd is None:
            return True
        alive = False
        for path in self.directory.glob(f"{self.prefix}*"):
            if path != self.path and _locked(path):
                alive = True
        return alive

    def finish(self, *metrics: object) -> bool:
        """At this copy's end: True when another copy shares its metrics (they are then kept forever, never
        deleted); False when they are this copy's alone, to be deleted. This copy's file goes either way."""
        shared = self.others_alive()
        if shared:
            keep_forever(*metrics)
        self.close()
        return shared

    def close(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _locked(path: Path) -> bool:
    """True when another process holds the file's lock; a file nobody locks is removed (its process is gone)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)
        return False
    finally:
        os.close(fd)


def keep_forever(*objects: object) -> None:
    """These objects are never freed in this process, not by its interpreter's teardown at exit either (an extra
    reference on the list holding them), so their destructors (a metric's: delete it in Triton) never run."""
    if not _KEPT:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEPT))
    _KEPT.extend(objects)
