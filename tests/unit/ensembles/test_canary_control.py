"""ensembles/canary.py over a fake model-control client: what is loaded and written, in which order, and refusals."""
from __future__ import annotations

import json

import pytest

from backend.policy.canary_router import RoutingTable
from ensembles.canary import CanaryController, CanaryError, ControlOptions
from ensembles.canary_render import ROUTER, ROUTING_FILE, routing_file, version_policy_line
from ensembles.server import ADMIN_HEADER


class FakeTriton:
    """The four tritonclient.http calls the controller makes; records loads and the headers sent."""

    def __init__(self, repo) -> None:
        self.repo, self.loaded, self.calls = repo, [1], []

    def get_model_repository_index(self, headers=None):
        self.calls.append(("index", headers))
        return [{"name": "tensorrt_llm", "version": str(v), "state": "READY"} for v in self.loaded]

    def get_model_config(self, model, headers=None):
        return {"name": model, "version_policy": {"latest": {"num_versions": 1}}}

    def load_model(self, model, headers=None, config=None):
        versions = json.loads(config)["version_policy"]["specific"]["versions"]
        # what the router reads at the moment of the load
        self.calls.append(("load", versions, RoutingTable.from_json(routing_file(self.repo).read_text()), headers))
        self.loaded = versions

    def is_model_ready(self, model, version, headers=None):
        return int(version) in self.loaded


@pytest.fixture
def control(tmp_path):
    for version in (1, 2, 3):
        (tmp_path / "tensorrt_llm" / str(version)).mkdir(parents=True)
    (tmp_path / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n' + version_policy_line([1]) + "\n")
    (tmp_path / ROUTER).mkdir()
    RoutingTable({1: 100}, stable=1).write(tmp_path / ROUTER / ROUTING_FILE)
    return CanaryController(ControlOptions("x:1", tmp_path, admin_key="k", drain_s=0.0), FakeTriton(tmp_path))


def test_start_loads_both_then_routes(control):
    table = control.start(version=2, weight=10)
    assert table == RoutingTable({1: 90, 2: 10}, stable=1, canary=2)
    (load,) = [c for c in control.client.calls if c[0] == "load"]
    assert load[1] == [1, 2] and load[2] == RoutingTable({1: 100}, stable=1)  # loaded before any traffic moves
    assert load[3] == {ADMIN_HEADER: "k"}  # the header the launcher restricts model control with
    config = (control.opts.model_repository / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "version_policy: { specific: { versions: [ 1, 2 ] } }" in config
    assert control.status() == {"stable": 1, "canary": 2, "weights": {"1": 90, "2": 10}, "loaded": [1, 2],
                                "installed": [1, 2, 3]}


def test_promote_routes_away_before_unloading(control):
    control.start(version=2, weight=10)
    assert control.set_weight(40).weights == {1: 60, 2: 40}
    assert control.promote() == RoutingTable({2: 100}, stable=2)
    last = [c for c in control.client.calls if c[0] == "load"][-1]
    assert last[1] == [2] and last[2] == RoutingTable({2: 100}, stable=2)
    assert control.client.loaded == [2]
    config = (control.opts.model_repository / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "version_policy: { specific: { versions: [ 2 ] } }" in config  # a restart loads what is routed to


def test_rollback_returns_to_stable(control):
    control.start(version=3, weight=50)
    assert control.rollback() == RoutingTable({1: 100}, stable=1)
    assert control.client.loaded == [1]


def test_refusals_name_the_problem(control):
    with pytest.raises(CanaryError, match=r"version 9 of tensorrt_llm is not installed \(installed: \[1, 2, 3\]\)"):
        control.start(version=9, weight=10)
    with pytest.raises(CanaryError, match=r"weight must be an integer in \[0, 100\], got 101"):
        control.start(version=2, weight=101)
    with pytest.raises(CanaryError, match="stable version"):
        control.start(version=1, weight=10)
    with pytest.raises(CanaryError, match="no canary running"):
        control.set_weight(10)
    with pytest.raises(CanaryError, match="no canary running"):
        control.promote()
    control.start(version=2, weight=10)
    with pytest.raises(CanaryError, match="already the canary"):
        control.start(version=3, weight=10)
    with pytest.raises(CanaryError, match=r"got -5"):
        control.set_weight(-5)
    assert control.client.loaded == [1, 2]


def test_repository_without_router_is_refused(tmp_path):
    with pytest.raises(CanaryError, match="render the repository with --canary"):
        ControlOptions("x:1", tmp_path)
