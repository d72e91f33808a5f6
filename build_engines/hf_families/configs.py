"""The TensorRT-LLM 1.2.x checkpoint config of a supported HF checkpoint, family by family (the keys TRT-LLM's own
converters write: llama/config.py, qwen/config.py, gemma/config.py, phi3/config.py; plus our sliding_window /
layer_types: TRT-LLM takes windows at run time, from KvCacheConfig.max_attention_window, which
backend/engine/trtllm_executor.py sets from them)."""
from __future__ import annotations

from backend.formats.checkpoint import TrtllmCheckpointConfig
from backend.formats.config_groups import Gemma2Keys
from build_engines.hf_families.fields import Family
from build_engines.hf_families.rope import rope_keys

SLIDING, FULL = "sliding_attention", "full_attention"


def checkpoint_config(family: Family, hf, raw: dict, dtype: str) -> TrtllmCheckpointConfig:
    """hf: the transformers 5 config object; raw: config.json as a dict (token ids as written)."""
    rope = rope_keys(hf, allow_longrope=family.model_type == "phi3")
    window, layer_types = _windows(family, hf)
    common = dict(
        architecture=family.architecture, dtype=dtype, vocab_size=hf.vocab_size,
        max_position_embeddings=hf.max_position_embeddings, hidden_size=hf.hidden_size,
        num_hidden_layers=hf.num_hidden_layers, num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=hf.num_key_value_heads or hf.num_attention_heads,
        head_size=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        intermediate_size=hf.intermediate_size, norm_epsilon=hf.rms_norm_eps, hidden_act=getattr(hf, "hidden_act", None),
        rotary_base=rope.rotary_base, rotary_scaling=rope.rotary_scaling, rotary_pct=rope.rotary_pct,
        position_embedding_type=rope.position_embedding_type, longrope=rope.longrope,
        tie_word_embeddings=bool(hf.tie_word_embeddings), sliding_window=window, layer_types=layer_types,
        bos_token_id=_single_id(raw.get("bos_token_id")), eos_token_id=_single_id(raw.get("eos_token_id")),
    )
    return TrtllmCheckpointConfig(**{**common, **_family_keys(family, hf)})


def _family_keys(family: Family, hf) -> dict:
    kind = family.model_type
    if kind in ("qwen2", "qwen3"):
        return dict(qwen_type=kind, attn_bias=kind == "qwen2", qk_layernorm=kind == "qwen3")
    if kind == "gemma2":
        if hf.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"Gemma2ForCausalLM: hidden_activation {hf.hidden_activation!r} is not supported (only "
                             f"'gelu_pytorch_tanh')")
        return dict(hidden_act=hf.hidden_activation, share_embedding_table=True,
                    gemma2=Gemma2Keys(hf.query_pre_attn_scalar, hf.attn_logit_softcapping,
                                      hf.final_logit_softcapping))
    if kind == "phi3":
        if hf.hidden_act != "silu":
            raise ValueError(f"Phi3ForCausalLM: hidden_act {hf.hidden_act!r} is not supported (only 'silu', which "
                             f"TensorRT-LLM writes as swiglu)")
        return dict(hidden_act="swiglu")
    return {}


def _windows(family: Family, hf) -> tuple[int | None, tuple[str, ...] | None]:
    """(sliding_window, layer_types) as HF 5 decides them: Mistral / Phi-3 slide on every layer when sliding_window
    is set; Qwen2/3 and Gemma 2 carry layer_types (derived by their configs from use_sliding_window /
    max_window_layers, or alternating for Gemma 2)."""
    n, window = hf.num_hidden_layers, getattr(hf, "sliding_window", None)
    if family.model_type in ("mistral", "phi3"):
        return (window, (SLIDING,) * n) if window is not None else (None, None)
    if family.model_type not in ("qwen2", "qwen3", "gemma2"):
        return None, None
    types = tuple(getattr(hf, "layer_types", None) or (FULL,) * n)
    if SLIDING in types and window is None:
        raise ValueError(f"{family.architecture}: layer_types has sliding_attention layers but sliding_window is null"
                         f" (use_sliding_window false?): HF cannot run this either")
    if SLIDING not in types:
        return None, None
    return window, types


def _single_id(value: int | list[int] | None) -> int | None:
    """HF allows a list of eos ids; TRT-LLM's config holds one (the first; generation_config.json, which travels
    with the artifact, keeps them all)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value
