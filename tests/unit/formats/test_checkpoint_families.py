"""At load, a TensorRT-LLM checkpoint's config.json is refused when any key says something this runtime would not
honour: unsupported architectures, family keys outside their rule, rotary settings, unknown keys, TRT-LLM keys at
values other than their inert defaults. The message names the key and the value."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.model.config import load_model_config


@pytest.fixture(scope="module")
def configs(family_checkpoint) -> dict[str, dict]:
    return {name: json.loads((family_checkpoint(name)[1] / "config.json").read_text())
            for name in ("llama2", "qwen3", "gemma2", "phi3_128k", "mistral")}


def _load(tmp_path: Path, data: dict):
    (tmp_path / "config.json").write_text(json.dumps(data))
    return load_model_config(tmp_path)


@pytest.mark.parametrize("name, change, message", [
    ("llama2", {"architecture": "MixtralForCausalLM"}, "architecture 'MixtralForCausalLM' is not supported"),
    ("llama2", {"residual_scale": 0.5}, "key residual_scale=0.5 is not supported by this runtime"),
    ("llama2", {"moe": {"num_experts": 8, "top_k": 2}}, "moe=.*'num_experts': 8.* is not supported"),
    ("llama2", {"embedding_multiplier": 12.0}, "embedding_multiplier=12.0 is not supported"),
    ("llama2", {"attn_bias": True}, r"LlamaForCausalLM: attn_bias True is not supported"),
    ("llama2", {"mlp_bias": True}, "mlp_bias true is not supported"),
    ("llama2", {"rotary_pct": 0.5}, "rotary_pct 0.5 is not supported"),
    ("llama2", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ("llama2", {"rotary_scaling": {"type": "mrope", "factor": 2.0}}, "rotary_scaling type 'mrope' is not supported"),
    ("llama2", {"rotary_scaling": {"type": "linear", "factor": 2.0, "alpha": 3}}, r"unsupported keys \['alpha'\]"),
    ("llama2", {"rotary_embedding_dim": 8}, "rotary_embedding_dim 8 is not head_size x rotary_pct"),
    ("llama2", {"mapping": {"world_size": 2, "tp_size": 1, "pp_size": 1, "cp_size": 2}}, "mapping.cp_size=2"),
    ("llama2", {"quantization": {"quant_algo": None, "clamp_val": [1, 2]}}, r"quantization.clamp_val=\[1, 2\]"),
    ("qwen3", {"attn_bias": True}, "Qwen3ForCausalLM: attn_bias True is not supported"),
    ("qwen3", {"qk_layernorm": False}, "Qwen3ForCausalLM: qk_layernorm False is not supported"),
    ("qwen3", {"use_logn_attn": True}, "use_logn_attn=True is not supported"),
    ("gemma2", {"inter_layernorms": False}, "inter_layernorms false is not supported"),
    ("gemma2", {"query_pre_attn_scalar": None}, "query_pre_attn_scalar must be a number > 0, got None"),
    ("phi3_128k", {"position_embedding_type": "rope_gpt_neox"}, r"long_rope and the longrope_\* keys \(.*\) go together"),
    ("phi3_128k", {"longrope_scaling_long_factors": [1.0, 2.0]}, "differ in length"),
    ("mistral", {"sliding_window": None}, "sliding_attention layers but sliding_window is null"),
    ("mistral", {"layer_types": ["sliding_attention"]}, "layer_types must list one of"),
])
def test_refused_at_load(configs, tmp_path, name, change, message):
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, {**configs[name], **change})


def test_trtllm_keys_at_their_inert_values_load(configs, tmp_path):
    """What TRT-LLM's own converters add (tensorrt_llm/models/llama/config.py to_dict, modeling_utils.py)."""
    extra = {"producer": {"name": "modelopt", "version": "0.x"}, "residual_mlp": False, "fc_after_embed": False,
             "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "layer_idx_offset": 0,
             "moe": {"num_experts": 0, "top_k": 0}, "disable_weight_only_quant_plugin": False,
             "rotary_embedding_dim": 16, "runtime_defaults": None, "embedding_multiplier": 1.0}
    cfg = _load(tmp_path, {**configs["llama2"], **extra})
    assert cfg.architecture == "LlamaForCausalLM" and cfg.rotary_dim == 16
