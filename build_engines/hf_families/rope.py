"""HF transformers 5 rotary parameters (config.rope_parameters, into which a legacy rope_theta / rope_scaling is
folded) -> the TRT-LLM keys: rotary_base, rotary_scaling {"type", ...} or, for longrope, position_embedding_type
long_rope with original_max_position_embeddings and the two factor lists; rotary_pct for partial rotary.

What TensorRT-LLM 1.2 would compute differently from HF is refused here, naming the key: an explicit
attention_factor (TRT-LLM derives it), a longrope `factor` that is not max_position_embeddings /
original_max_position_embeddings (TRT-LLM uses that ratio), yarn without truncation, and longrope outside Phi-3.
"""
from __future__ import annotations

from dataclasses import dataclass

from backend.formats.config_groups import LongRopeKeys

STATIC_TYPES = ("linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeKeys:
    rotary_base: float
    rotary_scaling: dict | None
    rotary_pct: float
    longrope: LongRopeKeys | None

    @property
    def position_embedding_type(self) -> str:
        return "long_rope" if self.longrope is not None else "rope_gpt_neox"


def rope_keys(hf, allow_longrope: bool) -> RopeKeys:
    """From a transformers 5 config object (its rope_parameters dict always holds rope_type and rope_theta)."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        raise ValueError("the HF config has no rope_parameters.rope_theta (transformers 5 always sets it): is this "
                         "a RoPE model?")
    base = float(params.pop("rope_theta"))
    pct = float(params.pop("partial_rotary_factor", 1.0))
    kind = params.pop("rope_type", None) or params.pop("type", "default")
    params.pop("type", None)
    if kind == "default":
        _refuse_extra(kind, params, set())
        return RopeKeys(base, None, pct, None)
    if kind == "longrope":
        if not allow_longrope:
            raise ValueError("rope_parameters rope_type 'longrope' is only supported for Phi-3 (TensorRT-LLM has "
                             "long_rope only there)")
        return RopeKeys(base, None, pct, _longrope(hf, params))
    if kind not in STATIC_TYPES:
        raise ValueError(f"rope_parameters rope_type {kind!r} is not supported (supported: default, "
                         f"{', '.join(STATIC_TYPES)}, longrope for Phi-3)")
    if kind == "yarn":
        params = _yarn(hf, params)
    return RopeKeys(base, {"type": kind, **params}, pct, None)


def _refuse_extra(kind: str, params: dict, allowed: set[str]) -> None:
    extra = {k: v for k, v in params.items() if k not in allowed and v is not None}
    if extra:
        raise ValueError(f"rope_parameters ({kind}) keys {extra} are not supported")


def _yarn(hf, params: dict) -> dict:
    if params.get("attention_factor") is not None:
        raise ValueError(f"rope_parameters yarn attention_factor={params['attention_factor']} is not supported "
                         f"(TensorRT-LLM 1.2 ignores it and derives the factor from mscale)")
    params.pop("attention_factor", None)
    if params.get("factor") is None:  # HF: max_position_embeddings / original; TRT-LLM would read 1.0: write it
        params["factor"] = hf.max_position_embeddings / params["original_max_position_embeddings"]
    return {k: v for k, v in params.items() if v is not None}


def _longrope(hf, params: dict) -> LongRopeKeys:
    omax = params.pop("original_max_position_embeddings")
    ratio = hf.max_position_embeddings / omax
    factor, attention_factor = params.pop("factor", None), params.pop("attention_factor", None)
    if factor is not None and factor != ratio:
        raise ValueError(f"rope_parameters longrope factor={factor} is not supported: TensorRT-LLM uses "
                         f"max_position_embeddings / original_max_position_embeddings ({ratio})")
    if attention_factor is not None:
        raise ValueError(f"rope_parameters longrope attention_factor={attention_factor} is not supported "
                         f"(TensorRT-LLM derives it from max_position_embeddings / original_max_position_embeddings)")
    short, long = params.pop("short_factor", None), params.pop("long_factor", None)
    if short is None or long is None:
        raise ValueError("rope_parameters longrope needs short_factor and long_factor lists")
    _refuse_extra("longrope", params, set())
    return LongRopeKeys(omax, tuple(float(x) for x in short), tuple(float(x) for x in long))
