"""Canary routing: which loaded version of the LLM model serves a request (no Triton here; the router model's
adapter, model_repository/router/1/model.py, calls it).

A routing table says which versions are served and with what weight (integers summing to 100). A request goes:
- to its pinned version (`model_version`), when it names one; a version not in the table is a clear error;
- by its sticky key (`session_id` or `tenant_id`) otherwise: the key hashes to a point on [0, 100) and each
  version, in ascending order, owns an arc as wide as its weight; so the same key lands on the same version while
  the weights are unchanged, and a weight change moves only the keys on the arcs that change owner;
- else by smooth weighted round-robin, which hits the weights exactly over every 100 requests (no sampling noise).

The table lives in a JSON file (written atomically by `python -m ensembles canary`); RoutingFile re-reads it when
its mtime changes, so a weight change never reloads a model, and so never drops a request.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

RING = 10_000  # hash points: weights are whole percents, so 100 points per percent


class RoutingError(ValueError):
    """A request the router cannot route (pinned to a version it does not serve): the client's error."""


@dataclass(frozen=True)
class RoutingTable:
    """Served versions and their weights; `stable` is the version a rollback returns to, `canary` the one on trial."""

    weights: dict[int, int]
    stable: int
    canary: int | None = None

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("a routing table needs at least one version")
        for version, weight in self.weights.items():
            if not isinstance(version, int) or version <= 0:
                raise ValueError(f"versions are positive integers, got {version!r}")
            if not isinstance(weight, int) or not 0 <= weight <= 100:
                raise ValueError(f"weight of version {version} must be an integer in [0, 100], got {weight!r}")
        if sum(self.weights.values()) != 100:
            raise ValueError(f"weights must sum to 100, got {dict(self.weights)}")
        for role, version in (("stable", self.stable), ("canary", self.canary)):
            if version is not None and version not in self.weights:
                raise ValueError(f"{role} version {version} has no weight in {dict(self.weights)}")
        if self.canary == self.stable:
            raise ValueError(f"canary and stable are the same version {self.stable}")

    @property
    def versions(self) -> list[int]:
        return sorted(self.weights)

    def to_json(self) -> str:
        data = {"stable": self.stable, "canary": self.canary,
                "weights": {str(v): w for v, w in sorted(self.weights.items())}}
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "RoutingTable":
        try:
            data = json.loads(text)
            weights = {int(v): w for v, w in data["weights"].items()}
            canary = data.get("canary")
            return cls(weights=weights, stable=int(data["stable"]), canary=None if canary is None else int(canary))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a routing table: {exc!r}") from exc

    def write(self, path: Path) -> None:
        """Atomically (write aside, then rename): a reader sees the old table or the new one, never half."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


def key_point(key: str) -> int:
    """The key's point on the ring [0, RING): stable across processes (not Python's salted hash())."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % RING


def owner(table: RoutingTable, point: int) -> int:
    """The version whose arc holds `point`; arcs follow ascending version order, each weight * RING/100 wide."""
    end = 0
    for version in table.versions:
        end += table.weights[version] * (RING // 100)
        if point < end:
            return version
    raise AssertionError("weights sum to 100, so the arcs cover the ring")


@dataclass
class Router:
    """Thread-safe routing decisions over a table that may be swapped at any time."""

    table: RoutingTable
    _current: dict[int, int] = field(default_factory=dict)  # smooth weighted round-robin state
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_table(self, table: RoutingTable) -> None:
        with self._lock:
            if table != self.table:
                self.table, self._current = table, {}

    def choose(self, key: str | None = None, pin: int | None = None, exclude: frozenset[int] = frozenset()) -> int:
        """The version for one request. `exclude`: versions found unavailable (a retry after a promotion)."""
        with self._lock:
            table = self.table
            if pin is not None:
                if pin not in table.weights:
                    raise RoutingError(f"model_version {pin} is not served; served versions: {table.versions}")
                return pin
            if key:
                chosen = owner(table, key_point(key))
                if chosen not in exclude:
                    return chosen
            return self._round_robin(table, exclude)

    def _round_robin(self, table: RoutingTable, exclude: frozenset[int]) -> int:
        """nginx's smooth weighted round-robin: add each weight, pick the largest, take 100 from it."""
        live = {v: w for v, w in table.weights.items() if w > 0 and v not in exclude}
        if not live:
            raise RoutingError(f"no version left to serve the request (weights {dict(table.weights)}, "
                               f"unavailable {sorted(exclude)})")
        for version, weight in live.items():
            self._current[version] = self._current.get(version, 0) + weight
        chosen = max(sorted(live), key=lambda v: self._current[v])
        self._current[chosen] -= sum(live.values())
        return chosen


class RoutingFile:
    """The routing table file, re-read when its mtime changes (checked at most every `check_period_s`)."""

    def __init__(self, path: Path, router: Router, check_period_s: float = 0.05, clock=None) -> None:
        import time

        self.path = Path(path)
        self.router = router
        self.check_period_s = check_period_s
        self._clock = clock or time.monotonic
        self._mtime_ns: int | None = None
        self._next_check = 0.0
        self.last_error: str | None = None

    def refresh(self) -> Router:
        """The router, with the file's table if it changed. A bad file keeps the last good table (and says why)."""
        now = self._clock()
        if now < self._next_check:
            return self.router
        self._next_check = now + self.check_period_s
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime != self._mtime_ns:
                self.router.set_table(RoutingTable.from_json(self.path.read_text()))
                self._mtime_ns, self.last_error = mtime, None
        except (OSError, ValueError) as exc:
            self.last_error = f"{self.path}: {exc}"
        return self.router


def routing_key(params: dict, session_id: str | None) -> str | None:
    """The sticky key: the `session_id` input, else the request parameter session_id, else tenant_id."""
    for value in (session_id, params.get("session_id"), params.get("tenant_id")):
        if value not in (None, ""):
            return str(value)
    return None


def pinned_version(params: dict, model_version: int | None) -> int | None:
    """The explicit pin: the `model_version` input, else the request parameter model_version."""
    value = model_version if model_version is not None else params.get("model_version")
    if value is None or value == "":
        return None
    try:
        version = int(value)
    except (TypeError, ValueError):
        raise RoutingError(f"model_version must be a positive integer, got {value!r}") from None
    if version <= 0:
        raise RoutingError(f"model_version must be a positive integer, got {version}")
    return version


def expected_finals(batch_rows: int, num_return_sequences=None) -> int:
    """How many `stream_final` responses end one forwarded request: one per row and returned sequence.
    `num_return_sequences`: the input as sent, (rows, 1) or None."""
    if num_return_sequences is None:
        return batch_rows
    return int(sum(max(1, int(n)) for n in num_return_sequences.reshape(-1)))
