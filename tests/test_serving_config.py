"""ServingConfig from the tensorrt_llm config.pbtxt parameters (string values, possibly unrendered)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.config import EngineConfig, SchedulerPolicy
from backend.serving_config import ServingConfig

CONFIG_PBTXT = Path(__file__).resolve().parent.parent / "model_repository" / "tensorrt_llm" / "config.pbtxt"


def template_parameters() -> dict[str, str]:
    """The parameters of the model repository's config.pbtxt as written: every value a ${...} placeholder."""
    pairs = re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}', CONFIG_PBTXT.read_text())
    assert len(pairs) > 10, f"no parameters found in {CONFIG_PBTXT}"
    return dict(pairs)


def test_unrendered_placeholders_mean_defaults():
    params = {k: (v if k != "gpt_model_path" else "/models/tiny") for k, v in template_parameters().items()}
    assert params["enable_chunked_context"] == "${enable_chunked_context}"  # the template is what is tested
    cfg = ServingConfig.from_parameters(params)
    assert cfg.engine == EngineConfig()
    assert cfg.engine_dir == Path("/models/tiny")
    assert cfg.exclude_input_in_output is True and cfg.engine.enable_chunked_context is True
    assert cfg.cancellation_check_period_s == 0.1


def test_explicit_values_are_parsed():
    cfg = ServingConfig.from_parameters({
        "gpt_model_path": "/ckpt", "max_batch_size": "8", "max_num_tokens": "512", "max_input_len": "256",
        "max_seq_len": "512", "tokens_per_block": "16", "max_tokens_in_paged_kv_cache": "4096",
        "batch_scheduler_policy": "max_utilization", "enable_chunked_context": "False", "engine_device": "cpu",
        "engine_threads": "2", "exclude_input_in_output": "no", "cancellation_check_period_ms": "250",
    })
    assert cfg.engine == EngineConfig(max_batch_size=8, max_num_tokens=512, max_input_len=256, max_seq_len=512,
                                      tokens_per_block=16, max_tokens_in_paged_kv_cache=4096,
                                      policy=SchedulerPolicy.MAX_UTILIZATION, enable_chunked_context=False,
                                      device="cpu", num_threads=2)
    assert cfg.exclude_input_in_output is False and cfg.cancellation_check_period_s == 0.25


@pytest.mark.parametrize("name", ["enable_chunked_context", "exclude_input_in_output"])
@pytest.mark.parametrize("value", ["maybe", "2", "on!"])
def test_bad_booleans_are_refused(name, value):
    with pytest.raises(ValueError, match=f"parameter {name} must be true or false, got '{re.escape(value)}'"):
        ServingConfig.from_parameters({"gpt_model_path": "/ckpt", name: value})


@pytest.mark.parametrize("path", [None, "", "${engine_dir}"])
def test_the_model_path_is_required(path):
    params = {} if path is None else {"gpt_model_path": path}
    with pytest.raises(ValueError, match="parameter gpt_model_path .* is required"):
        ServingConfig.from_parameters(params)


def test_limits_are_validated_by_the_engine_config():
    with pytest.raises(ValueError, match=r"max_input_len \(600\) must be < max_seq_len \(512\)"):
        ServingConfig.from_parameters({"gpt_model_path": "/ckpt", "max_input_len": "600", "max_seq_len": "512"})
