"""backend/policy/canary_router.py: routing table validation, weighted split, sticky keys, pins, file reload."""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest

from backend.policy.canary_router import (
    RING,
    Router,
    RoutingError,
    RoutingFile,
    RoutingTable,
    expected_finals,
    key_point,
    owner,
    pinned_version,
    routing_key,
)


def test_table_validation_names_the_problem():
    with pytest.raises(ValueError, match=r"weight of version 1 must be an integer in \[0, 100\], got -1"):
        RoutingTable({1: -1, 2: 101}, stable=1)  # the first bad one is named
    with pytest.raises(ValueError, match="sum to 100"):
        RoutingTable({1: 50, 2: 40}, stable=1)
    with pytest.raises(ValueError, match="canary version 3 has no weight"):
        RoutingTable({1: 100}, stable=1, canary=3)
    with pytest.raises(ValueError, match="positive integers"):
        RoutingTable({0: 100}, stable=0)
    with pytest.raises(ValueError, match="same version"):
        RoutingTable({1: 100}, stable=1, canary=1)


def test_table_json_round_trip_and_bad_file():
    table = RoutingTable({1: 70, 2: 30}, stable=1, canary=2)
    assert RoutingTable.from_json(table.to_json()) == table
    with pytest.raises(ValueError, match="not a routing table"):
        RoutingTable.from_json('{"weights": {}}')


def test_round_robin_hits_weights_exactly():
    router = Router(RoutingTable({1: 70, 2: 30}, stable=1, canary=2))
    counts = collections.Counter(router.choose() for _ in range(1000))
    assert counts == {1: 700, 2: 300}
    router.set_table(RoutingTable({1: 0, 2: 100}, stable=2, canary=1))
    assert {router.choose() for _ in range(50)} == {2}


def test_sticky_key_is_stable_and_moves_only_on_changed_arcs():
    before = Router(RoutingTable({1: 90, 2: 10}, stable=1, canary=2))
    after = Router(RoutingTable({1: 80, 2: 20}, stable=1, canary=2))
    keys = [f"user-{i}" for i in range(2000)]
    first = {k: before.choose(k) for k in keys}
    assert all(before.choose(k) == v for k, v in first.items())
    moved = [k for k in keys if after.choose(k) != first[k]]
    assert all(first[k] == 1 and after.choose(k) == 2 for k in moved)  # only 1 -> 2 on the growing arc
    assert 0.05 < len(moved) / len(keys) < 0.15
    assert abs(sum(v == 2 for v in first.values()) / len(keys) - 0.10) < 0.03


def test_arcs_follow_version_order():
    table = RoutingTable({1: 30, 2: 70}, stable=1, canary=2)
    assert owner(table, 0) == 1 and owner(table, 2999) == 1 and owner(table, 3000) == 2 and owner(table, RING - 1) == 2
    assert key_point("abc") == key_point("abc") and 0 <= key_point("abc") < RING


def test_pin_and_unknown_pin():
    router = Router(RoutingTable({1: 100, 2: 0}, stable=1, canary=2))
    assert router.choose(pin=2) == 2
    with pytest.raises(RoutingError, match=r"model_version 5 is not served; served versions: \[1, 2\]"):
        router.choose(pin=5)


def test_exclude_reroutes_and_reports_when_nothing_is_left():
    router = Router(RoutingTable({1: 50, 2: 50}, stable=1, canary=2))
    key = next(k for k in (f"k{i}" for i in range(100)) if router.choose(k) == 2)
    assert router.choose(key, exclude=frozenset({2})) == 1
    with pytest.raises(RoutingError, match="no version left"):
        router.choose(exclude=frozenset({1, 2}))


def test_routing_file_rereads_on_mtime_and_keeps_last_good(tmp_path):
    path = tmp_path / "routing.json"
    RoutingTable({1: 100}, stable=1).write(path)
    now = [0.0]
    routing = RoutingFile(path, Router(RoutingTable({1: 100}, stable=1)), check_period_s=0.05, clock=lambda: now[0])
    assert routing.refresh().table.versions == [1]
    RoutingTable({1: 60, 2: 40}, stable=1, canary=2).write(path)
    os.utime(path, ns=(1, 10**18))
    assert routing.refresh().table.versions == [1]  # within the check period: not re-read yet
    now[0] = 1.0
    assert routing.refresh().table.weights == {1: 60, 2: 40}
    path.write_text("{broken")
    now[0] = 2.0
    assert routing.refresh().table.weights == {1: 60, 2: 40} and "not a routing table" in routing.last_error


def test_key_and_pin_sources():
    assert routing_key({}, "s1") == "s1"
    assert routing_key({"session_id": "p"}, None) == "p"
    assert routing_key({"tenant_id": "t"}, "") == "t"
    assert routing_key({}, None) is None
    assert pinned_version({}, 3) == 3 and pinned_version({"model_version": "2"}, None) == 2
    assert pinned_version({}, None) is None
    with pytest.raises(RoutingError, match="positive integer"):
        pinned_version({"model_version": "x"}, None)
    with pytest.raises(RoutingError, match="positive integer"):
        pinned_version({}, 0)


def test_expected_finals():
    assert expected_finals(2) == 2
    assert expected_finals(2, np.array([[3], [1]], dtype=np.int32)) == 4
