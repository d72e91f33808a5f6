"""ensembles/canary_render.py: the router's config derives from tensorrt_llm's; the ensemble's LLM step goes to it."""
from __future__ import annotations

import re

import pytest

from backend.policy.canary_router import RoutingTable
from ensembles.canary_render import render_canary, route_ensemble, routing_file
from ensembles.render import TEMPLATES, RepoSpec


def _names(config: str, section: str) -> list[str]:
    block = re.search(rf"^{section} \[\n(.*?)^\]", config, re.MULTILINE | re.DOTALL).group(1)
    return re.findall(r'name: "(\w+)"', block)


@pytest.fixture
def repo(tmp_path, fake_model):
    engine, tokenizer = fake_model
    return render_canary(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer), tmp_path / "repo")


def test_router_has_llm_inputs_and_outputs_plus_its_own(repo):
    llm = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    router = (repo / "router" / "config.pbtxt").read_text()
    assert _names(router, "input") == ["session_id", "pin_version"] + _names(llm, "input")
    assert _names(router, "output") == ["served_version"] + _names(llm, "output")
    assert "reshape" not in router and "decoupled: true" in router
    assert f'string_value: "{routing_file(repo).resolve()}"' in router
    assert (repo / "router" / "1" / "model.py").is_file() and (repo / "router" / "tritonllm_env.py").is_file()


def test_ensemble_routes_through_router_and_reports_version(repo):
    ensemble = (repo / "ensemble" / "config.pbtxt").read_text()
    assert 'model_name: "tensorrt_llm"' not in ensemble and 'model_name: "router"' in ensemble
    assert _names(ensemble, "input")[:2] == ["session_id", "pin_version"]
    assert _names(ensemble, "output")[0] == "served_version"
    assert 'output_map { key: "OUT_SERVED_VERSION" value: "served_version" }' in ensemble


def test_llm_serves_version_1_and_stops_go_past_the_router(repo):
    """A cancelled stream's `stop` goes to tensorrt_llm (the version named by served_version), never queued behind the
    streams the router's instances forward."""
    assert "version_policy: { specific: { versions: [ 1 ] } }" in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "stop_model" not in (repo / "postprocessing" / "config.pbtxt").read_text()  # its default: tensorrt_llm
    bls = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert 'key: "tensorrt_llm_model_name" value: { string_value: "router" }' in bls
    assert 'key: "stop_model" value: { string_value: "tensorrt_llm" }' in bls
    assert RoutingTable.from_json(routing_file(repo).read_text()) == RoutingTable({1: 100}, stable=1)


def test_changed_ensemble_template_is_a_clear_error():
    text = (TEMPLATES / "ensemble" / "config.pbtxt").read_text()
    with pytest.raises(ValueError, match="ensemble template changed"):
        route_ensemble(text.replace('model_name: "tensorrt_llm"', 'model_name: "llm"'))


@pytest.mark.parametrize("field", ["bls_instance_count", "router_instance_count"])
def test_instance_counts_reach_tensorrt_llm_bls_and_the_router(tmp_path, fake_model, field):
    """Each instance serves one request at a time, so the count is how many are served at once; below 1 is refused."""
    engine, tokenizer = fake_model
    model = {"bls_instance_count": "tensorrt_llm_bls", "router_instance_count": "router"}[field]
    for value, folder in ((None, "default"), (40, "forty")):
        spec = RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, **({} if value is None else {field: value}))
        config = (render_canary(spec, tmp_path / folder) / model / "config.pbtxt").read_text()
        expected = value or RepoSpec.__dataclass_fields__[field].default
        assert f"instance_group [ {{ count: {expected} kind: KIND_CPU }} ]" in config, (field, value)
    with pytest.raises(ValueError, match=f"{field} must be > 0, got 0"):
        RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, **{field: 0})
