"""The config.pbtxt reader (backend/serving/parameters.py): ServingConfig from tensorrt_llm's parameters (string
values, possibly unrendered), one boolean rule, and the other models' configs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.engine.config import EngineConfig, SchedulerPolicy
from backend.serving.parameters import (
    BlsConfig,
    ModelParameters,
    PostprocessingConfig,
    PreprocessingConfig,
    RouterConfig,
    ServingConfig,
    read_model_config,
)
from tests.unit.pbtxt import pbtxt_parameters

CONFIG_PBTXT = Path(__file__).resolve().parents[3] / "model_repository" / "tensorrt_llm" / "config.pbtxt"


def template_parameters() -> dict[str, str]:
    """The parameters of the model repository's config.pbtxt as written: every value a ${...} placeholder."""
    pairs = pbtxt_parameters(CONFIG_PBTXT)
    assert len(pairs) > 10, f"no parameters found in {CONFIG_PBTXT}"
    return pairs


def test_unrendered_placeholders_mean_defaults():
    params = {k: (v if k != "gpt_model_path" else "/models/tiny") for k, v in template_parameters().items()}
    assert params["enable_chunked_context"] == "${enable_chunked_context}"  # the template is what is tested
    cfg = ServingConfig.from_parameters(ModelParameters(params))
    assert cfg.engine == EngineConfig()
    assert cfg.engine_dir == Path("/models/tiny")
    assert cfg.exclude_input_in_output is True and cfg.engine.enable_chunked_context is True
    assert cfg.cancellation_check_period_s == 0.1


def test_explicit_values_are_parsed():
    cfg = ServingConfig.from_parameters(ModelParameters({
        "gpt_model_path": "/ckpt", "max_batch_size": "8", "max_num_tokens": "512", "max_input_len": "256",
        "max_seq_len": "512", "tokens_per_block": "16", "max_tokens_in_paged_kv_cache": "4096",
        "batch_scheduler_policy": "max_utilization", "enable_chunked_context": "False", "engine_device": "cpu",
        "engine_threads": "2", "engine_adaptive_threads": "false", "exclude_input_in_output": "no", "cancellation_check_period_ms": "250",
    }))
    assert cfg.engine == EngineConfig(max_batch_size=8, max_num_tokens=512, max_input_len=256, max_seq_len=512,
                                      tokens_per_block=16, max_tokens_in_paged_kv_cache=4096,
                                      policy=SchedulerPolicy.MAX_UTILIZATION, enable_chunked_context=False,
                                      device="cpu", num_threads=2, adaptive_threads=False)
    assert cfg.exclude_input_in_output is False and cfg.cancellation_check_period_s == 0.25


@pytest.mark.parametrize("name", ["enable_chunked_context", "exclude_input_in_output", "engine_adaptive_threads"])
@pytest.mark.parametrize("value", ["maybe", "2", "on!"])
def test_bad_booleans_are_refused(name, value):
    with pytest.raises(ValueError, match=f"parameter {name} must be true or false, got '{re.escape(value)}'"):
        ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", name: value}))


@pytest.mark.parametrize("path", [None, "", "${engine_dir}"])
def test_the_model_path_is_required(path):
    params = {} if path is None else {"gpt_model_path": path}
    with pytest.raises(ValueError, match="parameter gpt_model_path .* is required"):
        ServingConfig.from_parameters(ModelParameters(params))


def test_limits_are_validated_by_the_engine_config():
    with pytest.raises(ValueError, match=r"max_input_len \(600\) must be < max_seq_len \(512\)"):
        ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "max_input_len": "600",
                                                       "max_seq_len": "512"}))


def test_tenancy_parameters(tmp_path):
    cfg = ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "limits_file": str(tmp_path / "l.toml"),
                                                         "tenant_header": "${x}"}))
    assert cfg.tenancy.limits_file == tmp_path / "l.toml" and cfg.tenancy.tenant_header == "x-tenant-id"
    cfg = ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "limits_file": "",
                                                         "tenant_header": "x-org"}))
    assert cfg.tenancy.limits_file is None and cfg.tenancy.tenant_header == "x-org"


def test_one_boolean_rule_for_every_model():
    for value, expected in (("true", True), ("FALSE", False), ("1", True), ("no", False), ("${x}", False)):
        params = ModelParameters({"tokenizer_dir": "/tok", "add_special_tokens": value})
        assert PreprocessingConfig.from_parameters(params).add_special_tokens is expected
    with pytest.raises(ValueError, match="parameter add_special_tokens must be true or false"):
        PreprocessingConfig.from_parameters(ModelParameters({"tokenizer_dir": "/tok", "add_special_tokens": "y"}))


def test_from_model_config_and_the_other_models():
    config = {"parameters": {"tokenizer_dir": {"string_value": "/tok"}, "max_prompt_bytes": {"string_value": "64"},
                             "stop_model": {"string_value": "router"}}}
    params = ModelParameters.from_model_config(config)
    assert PreprocessingConfig.from_parameters(params).max_prompt_bytes == 64
    assert PostprocessingConfig.from_parameters(params).stop_model == "router"
    assert PostprocessingConfig.from_parameters(ModelParameters({"tokenizer_dir": "/t"})).stop_model == "tensorrt_llm"
    with pytest.raises(ValueError, match="parameter routing_file .* is required"):
        RouterConfig.from_parameters(ModelParameters({"llm_model": "tensorrt_llm"}))
    with pytest.raises(ValueError, match="parameter max_prompt_bytes must be an integer, got 'lots'"):
        PreprocessingConfig.from_parameters(ModelParameters({"tokenizer_dir": "/t", "max_prompt_bytes": "lots"}))


def test_enable_kv_cache_reuse_has_one_default():
    from backend.engine.config import engine_default
    from ensembles.render import RepoSpec

    assert engine_default("enable_kv_cache_reuse") is True
    assert EngineConfig().enable_kv_cache_reuse is True
    assert ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/c"})).engine.enable_kv_cache_reuse
    assert RepoSpec.__dataclass_fields__["enable_kv_cache_reuse"].default is True


@pytest.mark.parametrize("value, interval", [(None, 1), ("${stream_interval}", 1), ("1", 1), ("4", 4)])
def test_stream_interval_is_read(value, interval):
    params = {"gpt_model_path": "/ckpt"} | ({} if value is None else {"stream_interval": value})
    assert ServingConfig.from_parameters(ModelParameters(params)).stream_interval == interval


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_stream_interval_is_refused_by_name(value):
    with pytest.raises(ValueError, match="stream_interval"):
        ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "stream_interval": value}))


def test_cancellation_check_period_must_be_positive():
    from backend.serving.parameters import ServingConfig

    with pytest.raises(ValueError, match="cancellation_check_period_ms"):
        ServingConfig(engine_dir=Path("x"), engine=EngineConfig(), cancellation_check_period_s=0.0)


@pytest.mark.parametrize("value, mode", [("true", "on"), ("False", "off"), ("auto", "auto"), ("", "auto"),
                                         ("${cuda_graph_mode}", "auto")])
def test_cuda_graph_mode_takes_the_anchors_boolean_or_auto(value, mode):
    params = ModelParameters({"gpt_model_path": "/ckpt", "cuda_graph_mode": value, "engine_device": "cuda"})
    assert ServingConfig.from_parameters(params).engine.cuda_graph_mode == mode


def test_a_bad_cuda_graph_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="parameter cuda_graph_mode must be true, false or auto, got 'sometimes'"):
        ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "cuda_graph_mode": "sometimes"}))


def test_a_parameter_no_model_reads_is_refused_by_name():
    """Nothing set in a config.pbtxt is silently ignored: tensorrtllm_backend's parameters this engine does not
    implement, and typos, fail the load naming them; unset, empty and ${...} values do not."""
    params = ModelParameters({"gpt_model_path": "/ckpt", "normalize_log_probs": "false", "enable_kv_cache_resue": "1",
                              "gpu_device_ids": "", "lora_cache_optimal_adapter_size": "${lora_cache_size}",
                              "FORCE_CPU_ONLY_INPUT_TENSORS": "no"})
    ServingConfig.from_parameters(params)
    with pytest.raises(ValueError, match=r"tensorrt_llm: config.pbtxt parameter\(s\) enable_kv_cache_resue='1', "
                                         r"normalize_log_probs='false' not supported by this model"):
        params.refuse_unread("tensorrt_llm")
    known = ModelParameters({"gpt_model_path": "/ckpt", "stream_interval": "2", "max_beam_width": "1"})
    ServingConfig.from_parameters(known)
    known.refuse_unread("tensorrt_llm")


@pytest.mark.parametrize("name, value", [("max_beam_width", "4"), ("gpt_model_type", "V1")])
def test_anchor_parameters_are_accepted_only_at_what_this_engine_does(name, value):
    ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", "max_beam_width": "1",
                                                   "gpt_model_type": "inflight_fused_batching"}))
    with pytest.raises(ValueError, match=f"parameter {name} must be .*, got '{value}'"):
        ServingConfig.from_parameters(ModelParameters({"gpt_model_path": "/ckpt", name: value}))


def test_skip_special_tokens_is_the_anchors_postprocessing_flag():
    assert PostprocessingConfig.from_parameters(ModelParameters({"tokenizer_dir": "/t"})).skip_special_tokens is True
    params = ModelParameters({"tokenizer_dir": "/t", "skip_special_tokens": "false"})
    assert PostprocessingConfig.from_parameters(params).skip_special_tokens is False
    assert BlsConfig.from_parameters(params).skip_special_tokens is False
    params.refuse_unread("postprocessing")


def test_bls_parameters():
    bls = BlsConfig.from_parameters(ModelParameters({"tokenizer_dir": "/tok", "tensorrt_llm_model_name": "router"}))
    assert (bls.llm_model, bls.stop_model, bls.pre.tokenizer_dir) == ("router", "router", Path("/tok"))
    assert BlsConfig.from_parameters(ModelParameters({"tokenizer_dir": "/t", "stop_model": "x"})).stop_model == "x"


def test_read_model_config_reads_by_role_and_names_the_served_model():
    """What every model.py's initialize() calls: the role picks the config, the error names the model as served."""
    config = {"parameters": {"tokenizer_dir": {"string_value": "/t"}, "skip_special_tokens": {"string_value": "0"}}}
    post = read_model_config(config, "my_postprocessing", "postprocessing")
    assert isinstance(post, PostprocessingConfig) and post.skip_special_tokens is False
    config["parameters"]["clean_up_tokenization_spaces"] = {"string_value": "true"}
    with pytest.raises(ValueError, match=r"my_postprocessing: config.pbtxt parameter\(s\) "
                                         r"clean_up_tokenization_spaces='true' not supported"):
        read_model_config(config, "my_postprocessing", "postprocessing")
    with pytest.raises(KeyError):
        read_model_config(config, "x", "detokenizer")
