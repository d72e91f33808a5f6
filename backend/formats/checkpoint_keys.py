"""Every config.json key is read or refused: nothing a checkpoint says is silently ignored.

TensorRT-LLM's converters write more keys than this runtime models (tensorrt_llm/models/modeling_utils.py
PretrainedConfig, llama/config.py LLaMAConfig, qwen/config.py QWenConfig). Each of those is listed here with
the values at which it changes nothing (a metadata key takes any value); a checkpoint carrying another value,
or a key known to nobody here, is refused with the key and its value named.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ANY = object()  # metadata: any value is inert


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: v in values


def _moe_off(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and not v.get("num_experts"))


def _one(v: Any) -> bool:
    return v in (None, 1, 1.0)


# key -> predicate on the value that holds when the key changes nothing (or _ANY).
INERT: dict[str, Any] = {
    "producer": _ANY, "runtime_defaults": _ANY, "rotary_embedding_dim": _ANY,  # (rotary_embedding_dim: checked below)
    "disable_weight_only_quant_plugin": _ANY,  # a TRT build switch; the math is the same
    "seq_length": _ANY,  # Qwen: only read by logn attention, which must be off
    "num_labels": _ANY, "norm_type": _is("rms_norm", None),
    "residual_mlp": _is(False), "fc_after_embed": _is(False), "use_input_layernorm_in_first_layer": _is(True),
    "use_last_layernorm": _is(True), "layer_idx_offset": _is(0), "remove_duplicated_kv_heads": _is(False),
    "has_partial_lora_mask": _is(False), "use_logn_attn": _is(False), "use_dynamic_ntk": _is(False),
    "moe": _moe_off, "moe_num_experts": _is(0, None), "moe_top_k": _is(0, None),
    "embedding_multiplier": _one, "attention_multiplier": _one, "residual_multiplier": _one,
    "output_multiplier_scale": _one, "mlp_only_layers": _is(None, []), "decoder_sparse_step": _is(None, 1),
}
# Sub-dicts: keys of TRT-LLM's Mapping / QuantConfig this runtime does not model, with their inert values.
MAPPING_INERT: dict[str, Any] = {"rank": _ANY, "gpus_per_node": _ANY, "cp_size": _is(1), "moe_tp_size": _ANY,
                                 "moe_ep_size": _is(1, None), "moe_cluster_size": _is(1, None),
                                 "attn_tp_size": _ANY, "attn_cp_size": _is(1, None), "auto_parallel": _is(False)}
QUANT_INERT: dict[str, Any] = {"smoothquant_val": _ANY, "clamp_val": _is(None), "use_meta_recipe": _is(False)}


def check_keys(data: dict, known: set[str]) -> None:
    """Raise ValueError for the first key of `data` that is neither known (read by the config) nor inert."""
    _check(data, known | {"mapping", "quantization"}, INERT, "")
    _check(data.get("mapping") or {}, {"world_size", "tp_size", "pp_size"}, MAPPING_INERT, "mapping.")
    _check(data.get("quantization") or {}, {"quant_algo", "kv_cache_quant_algo", "group_size", "has_zero_point",
                                            "pre_quant_scale", "exclude_modules"}, QUANT_INERT, "quantization.")
    rot = data.get("rotary_embedding_dim")
    if rot is not None and rot != int(data["head_size"] * data.get("rotary_pct", 1.0)):
        raise ValueError(f"checkpoint config: rotary_embedding_dim {rot} is not head_size x rotary_pct "
                         f"({data['head_size']} x {data.get('rotary_pct', 1.0)}); set rotary_pct instead")


def _check(data: dict, known: set[str], inert: dict[str, Any], prefix: str) -> None:
    for key, value in data.items():
        if key in known:
            continue
        if key not in inert:
            raise ValueError(f"checkpoint config key {prefix}{key}={value!r} is not supported by this runtime "
                             f"(it may change the computation); remove it if it does not")
        if inert[key] is not _ANY and not inert[key](value):
            raise ValueError(f"checkpoint config: {prefix}{key}={value!r} is not supported by this runtime "
                             f"(only its default, which changes nothing, is)")
