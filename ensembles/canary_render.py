"""Render the repository with the canary router between the ensemble and the LLM model.

The ensemble's LLM step goes to `router` (model_repository/router) instead of `tensorrt_llm`; the router has the
tensorrt_llm model's inputs and outputs (derived here from its rendered config, so they never drift) plus:
    inputs  session_id (STRING [1], optional)  sticky routing key
            pin_version (INT32 [1], optional)  serve this version, or INVALID_ARG when it is not served
    output  served_version (INT32 [1])         the version that served the response
The ensemble gains those inputs and the `served_version` output (additive: the anchor's contract is unchanged).
tensorrt_llm gets an explicit version_policy (only version 1 at start; `python -m ensembles canary` loads more),
tensorrt_llm_bls calls the router, postprocessing and tensorrt_llm_bls send a cancelled stream's `stop` straight to
the version that served it, and `router/routing.json` starts at {1: 100}. The router is decoupled as tensorrt_llm
is (decoupled_mode), with router_instance_count instances (each forwards one request at a time).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from backend.policy.canary_router import RoutingTable
from ensembles.render import ENSEMBLE_MODELS, TEMPLATES, RepoSpec, default_python_paths, env_module, render

ROUTER = "router"
ROUTING_FILE = "routing.json"
_RESHAPE = re.compile(r"\s*reshape: \{ shape: \[ \] \}")
_ENSEMBLE_INPUTS = ('  { name: "session_id" data_type: TYPE_STRING dims: [ 1 ] optional: true },\n'
                    '  { name: "pin_version" data_type: TYPE_INT32 dims: [ 1 ] optional: true },\n')
_POLICY = re.compile(r"^version_policy: .*$", re.MULTILINE)
_VERSION_OUTPUT = '  { name: "served_version" data_type: TYPE_INT32 dims: [ 1 ] },\n'


def routing_file(repo_dir: Path) -> Path:
    return Path(repo_dir) / ROUTER / ROUTING_FILE


def _block(config: str, section: str) -> str:
    """The entries of a top-level `section [ ... ]` list of a rendered config.pbtxt."""
    match = re.search(rf"^{section} \[\n(.*?)^\]", config, re.MULTILINE | re.DOTALL)
    if match is None:
        raise ValueError(f"no top-level '{section} [' list in the tensorrt_llm config")
    return match.group(1).rstrip()


def router_config(llm_config: str, routing: Path, max_batch_size: int, decoupled: bool = True,
                  instances: int = 16) -> str:
    """The router's config.pbtxt: the LLM's inputs (without reshape: tensors are forwarded as received) and outputs;
    decoupled as the LLM model is; `instances` instances, each forwarding one request at a time."""
    inputs = _RESHAPE.sub("", _block(llm_config, "input"))
    return "\n".join([
        "# Canary router (rendered by ensembles/canary_render.py from tensorrt_llm's config; do not edit).",
        f'name: "{ROUTER}"', 'backend: "python"', f"max_batch_size: {max_batch_size}",
        f"model_transaction_policy {{ decoupled: {'true' if decoupled else 'false'} }}",
        "input [", _ENSEMBLE_INPUTS + inputs, "]",
        "output [", _VERSION_OUTPUT + _block(llm_config, "output"), "]",
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]",
        'parameters { key: "llm_model" value: { string_value: "tensorrt_llm" } }',
        f'parameters {{ key: "routing_file" value: {{ string_value: "{routing}" }} }}', "",
    ])


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"ensemble template changed: expected one {what!r}")
    return text.replace(old, new)


def route_ensemble(config: str) -> str:
    """The ensemble config with its LLM step sent to the router, and the router's extra inputs/outputs wired."""
    step = 'model_name: "{}"\n      model_version: -1\n'
    config = _replace_once(config, "input [\n", "input [\n" + _ENSEMBLE_INPUTS, "input [")
    config = _replace_once(config, "output [\n", "output [\n" + _VERSION_OUTPUT, "output [")
    config = _replace_once(config, step.format("tensorrt_llm"), step.format(ROUTER)
                           + '      input_map { key: "session_id" value: "session_id" }\n'
                           + '      input_map { key: "pin_version" value: "pin_version" }\n'
                           + '      output_map { key: "served_version" value: "_SERVED_VERSION" }\n',
                           "tensorrt_llm step")
    return _replace_once(config, step.format("postprocessing"), step.format("postprocessing")
                         + '      input_map { key: "SERVED_VERSION" value: "_SERVED_VERSION" }\n'
                         + '      output_map { key: "OUT_SERVED_VERSION" value: "served_version" }\n',
                         "postprocessing step")


def version_policy_line(versions: list[int]) -> str:
    return f"version_policy: {{ specific: {{ versions: [ {', '.join(str(v) for v in sorted(versions))} ] }} }}"


def persist_versions(repo_dir: Path, versions: list[int], model: str = "tensorrt_llm") -> None:
    """Write the loaded version set into the model's config.pbtxt, so a restarted server loads the same versions
    the routing table routes to (the running server is unaffected: explicit mode re-reads only on load)."""
    path = Path(repo_dir) / model / "config.pbtxt"
    text, count = _POLICY.subn(version_policy_line(versions), path.read_text())
    if count != 1:
        raise ValueError(f"{path}: expected one version_policy line (render the repository with --canary)")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text().rstrip("\n") + "\n" + line + "\n")


def render_canary(spec: RepoSpec, out_dir: Path) -> Path:
    """render() plus the router; the LLM model serves version 1 until `canary start` loads another."""
    repo = render(spec, out_dir, ENSEMBLE_MODELS)
    llm_config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    router_dir = repo / ROUTER
    if router_dir.exists():
        shutil.rmtree(router_dir)
    shutil.copytree(TEMPLATES / ROUTER, router_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (router_dir / "tritonllm_env.py").write_text(env_module(spec.python_paths or default_python_paths()))
    routing = routing_file(repo)
    (router_dir / "config.pbtxt").write_text(router_config(llm_config, routing.resolve(), spec.triton_max_batch_size,
                                                           spec.decoupled_mode, spec.router_instance_count))
    RoutingTable({1: 100}, stable=1).write(routing)
    ensemble = repo / "ensemble" / "config.pbtxt"
    ensemble.write_text(route_ensemble(ensemble.read_text()))
    _append(repo / "tensorrt_llm" / "config.pbtxt", version_policy_line([1]))
    # Several versions load at once here, and the 2.51 Python backend crashes the server when such a model uses the
    # metric API: the engine publishes none, the router publishes per-version figures (backend/serving/router_metrics.py).
    _append(repo / "tensorrt_llm" / "config.pbtxt",
            'parameters { key: "publish_engine_metrics" value: { string_value: "false" } }')
    # postprocessing and tensorrt_llm_bls send a cancelled stream's `stop` to tensorrt_llm, to the version the router
    # says served it (served_version): not through the router, whose instances may all be forwarding streams.
    bls = repo / "tensorrt_llm_bls" / "config.pbtxt"  # the BLS model's LLM calls go through the router
    bls.write_text(_replace_once(bls.read_text(), '"tensorrt_llm_model_name" value: { string_value: "tensorrt_llm" }',
                                 f'"tensorrt_llm_model_name" value: {{ string_value: "{ROUTER}" }}', "BLS LLM name"))
    return repo
