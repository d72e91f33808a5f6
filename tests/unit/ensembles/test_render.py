"""ensembles/render.py and the CLI: decoupled_mode, logits_datatype and stop_by_request_id render into every model
that has them; tensorrt_llm_bls is rendered beside the ensemble."""
from __future__ import annotations

import os

import pytest

from backend.serving import parameters as pp
from ensembles.canary_render import render_canary
from ensembles.cli import _parser, server_cpus_of
from ensembles.render import RepoSpec, render
from tests.unit.pbtxt import as_model_config, pbtxt_parameters


@pytest.mark.parametrize("decoupled", [True, False])
def test_decoupled_mode_renders_into_the_llm_and_bls_models(fake_model, tmp_path, decoupled):
    engine, tokenizer = fake_model
    repo = render(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, decoupled_mode=decoupled,
                           logits_datatype="TYPE_FP16", stop_by_request_id=True), tmp_path / "repo")
    line = f"model_transaction_policy {{ decoupled: {'true' if decoupled else 'false'} }}"
    for model in ("tensorrt_llm", "tensorrt_llm_bls"):
        assert line in (repo / model / "config.pbtxt").read_text()
    llm = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert '{ name: "context_logits" data_type: TYPE_FP16 dims: [ -1, -1 ] }' in llm
    assert '"stop_by_request_id" value: { string_value: "true" }' in llm
    assert (repo / "tensorrt_llm_bls" / "1" / "model.py").is_file()
    assert (repo / "tensorrt_llm_bls" / "tritonllm_env.py").is_file()
    router = (render_canary(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, decoupled_mode=decoupled),
                            tmp_path / "canary") / "router" / "config.pbtxt").read_text()
    assert line in router


def test_logits_datatype_is_checked(fake_model):
    with pytest.raises(ValueError, match="logits_datatype must be one of TYPE_FP32, TYPE_FP16, TYPE_BF16"):
        RepoSpec(engine_dir=fake_model[0], tokenizer_dir=fake_model[1], logits_datatype="FP32")


def test_cuda_graph_mode_renders_and_is_checked(fake_model, tmp_path):
    engine, tokenizer = fake_model
    args = _parser().parse_args(["render", "--demo", "--cuda-graph-mode", "false"])
    repo = render(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, cuda_graph_mode=args.cuda_graph_mode),
                  tmp_path / "repo")
    assert '"cuda_graph_mode" value: { string_value: "false" }' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    with pytest.raises(ValueError, match="cuda_graph_mode must be true, false or auto, got 'always'"):
        RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, cuda_graph_mode="always")


def rendered_parameters(config_pbtxt) -> pp.ModelParameters:
    return pp.ModelParameters(pbtxt_parameters(config_pbtxt))


@pytest.mark.parametrize("canary", [False, True])
def test_every_rendered_parameter_is_read_by_its_model(fake_model, tmp_path, canary):
    engine, tokenizer = fake_model
    spec = RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, engine_threads=1)
    repo = (render_canary if canary else render)(spec, tmp_path / "repo")
    checked = []
    for config in sorted(repo.glob("*/config.pbtxt")):
        model = config.parent.name
        if model in pp.CONFIG_OF:  # what the model's initialize() reads (model_repository/*/1/model.py)
            pp.read_model_config(as_model_config(config), model, role=model)
            checked.append(model)
    assert set(checked) == set(pp.CONFIG_OF) - (set() if canary else {"router"})


def test_stream_interval_renders_into_what_tensorrt_llm_reads(fake_model, tmp_path):
    engine, tokenizer = fake_model
    args = _parser().parse_args(["render", "--demo", "--stream-interval", "4"])
    repo = render(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, stream_interval=args.stream_interval),
                  tmp_path / "repo")
    params = rendered_parameters(repo / "tensorrt_llm" / "config.pbtxt")
    assert pp.ServingConfig.from_parameters(params).stream_interval == 4
    with pytest.raises(ValueError, match="stream_interval must be > 0, got 0"):
        RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, stream_interval=0)


def test_cli_takes_decoupled_mode():
    args = _parser().parse_args(["serve", "--demo", "--decoupled-mode", "false", "--stop-by-request-id", "true"])
    assert args.decoupled_mode is False and args.stop_by_request_id is True
    with pytest.raises(SystemExit):
        _parser().parse_args(["render", "--decoupled-mode", "maybe"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_engine_cpus_auto_renders_a_list_and_the_launcher_keeps_tritonserver_off_it(fake_model, tmp_path):
    engine, tokenizer = fake_model
    usable = os.sched_getaffinity(0)
    repo = render(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer, engine_threads=1, engine_cpus="auto"),
                  tmp_path / "repo")
    llm = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert f'"engine_cpus" value: {{ string_value: "{max(usable)}" }}' in llm
    assert server_cpus_of(repo) == usable - {max(usable)}
    plain = render(RepoSpec(engine_dir=engine, tokenizer_dir=tokenizer), tmp_path / "plain")
    assert '"engine_cpus" value: { string_value: "" }' in (plain / "tensorrt_llm" / "config.pbtxt").read_text()
    assert server_cpus_of(plain) is None


@pytest.mark.parametrize(("cpus", "threads", "message"), [
    ("auto", None, "engine_cpus auto needs engine_threads"),
    ("zero", 1, "engine_cpus must be a CPU list"),
    ("4096", 1, "names CPUs 4096 this process may not use"),
])
def test_bad_engine_cpus_fail_at_render(fake_model, cpus, threads, message):
    with pytest.raises(ValueError, match=message):
        RepoSpec(engine_dir=fake_model[0], tokenizer_dir=fake_model[1], engine_threads=threads, engine_cpus=cpus)


def test_cli_takes_engine_cpus():
    assert _parser().parse_args(["serve", "--demo", "--engine-cpus", "auto"]).engine_cpus == "auto"
