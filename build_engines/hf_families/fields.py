"""Every field of a supported family's HF config.json is read, known to change nothing, or refused.

Per family (HF model_type), each config field is one of:
- READ: converted into the TRT-LLM config (configs.py / rope.py), whose own checks refuse values it cannot express;
- INERT: changes nothing at inference in HF transformers 5 (metadata, dropout, init, cache plumbing; the unit
  test proves each by running HF with another value and comparing logits);
- Must(values): only these values are served, any other is refused here, naming the field and the value.
A field in none of these (a newer transformers field, a remote-code extension) is refused too: nothing is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READ, INERT = "read", "inert"


@dataclass(frozen=True)
class Must:
    allowed: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str  # HF's and TensorRT-LLM 1.2's architecture name
    fields: dict[str, str | Must]


_META = {k: INERT for k in (
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "id2label",
    "label2id", "problem_type", "return_dict", "output_attentions", "output_hidden_states", "chunk_size_feed_forward",
    "use_cache", "initializer_range", "attention_dropout", "pad_token_id", "auto_map", "cache_implementation")}
_SHAPES = {k: READ for k in (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "rope_theta",
    "rope_scaling", "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act")}
_COMMON: dict[str, str | Must] = {
    **_META, **_SHAPES,
    "is_encoder_decoder": Must((False,), "a decoder-only model"),
    "partial_rotary_factor": Must((1, 1.0), "this family rotates whole heads (HF's attention assumes it)"),
}
_NO_BIAS = Must((False,), "TensorRT-LLM's model of this family has no attention bias")
_QWEN_WINDOWS = {"use_sliding_window": READ, "sliding_window": READ, "max_window_layers": READ, "layer_types": READ}

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", {
        **_COMMON, "attention_bias": Must((False,), "Llama attention biases (q, k, v and o) are not supported"),
        "mlp_bias": Must((False,), "Llama MLP biases are not supported"),
        "pretraining_tp": INERT}),  # transformers 5 no longer reads it
    Family("mistral", "MistralForCausalLM", {**_COMMON, "sliding_window": READ}),
    Family("qwen2", "Qwen2ForCausalLM", {**_COMMON, **_QWEN_WINDOWS}),
    Family("qwen3", "Qwen3ForCausalLM", {**_COMMON, **_QWEN_WINDOWS, "attention_bias": _NO_BIAS}),
    Family("gemma2", "Gemma2ForCausalLM", {
        **_COMMON, "hidden_act": INERT,  # transformers 5's Gemma 2 reads hidden_activation
        "hidden_activation": READ, "query_pre_attn_scalar": READ, "attn_logit_softcapping": READ,
        "final_logit_softcapping": READ, "sliding_window": READ, "layer_types": READ, "attention_bias": _NO_BIAS,
        "use_bidirectional_attention": Must((None, False), "bidirectional attention is not causal decoding")}),
    Family("phi3", "Phi3ForCausalLM", {
        **_COMMON, "partial_rotary_factor": READ, "original_max_position_embeddings": READ, "sliding_window": READ,
        "resid_pdrop": INERT, "embd_pdrop": INERT,
        "attention_bias": INERT}),  # HF's Phi-3 has no biases whatever it says (a bias tensor is refused)
)}

# Families people ask for that this converter refuses, with what stands in the way.
UNSUPPORTED: dict[str, str] = {
    "gemma": "Gemma 1 (not Gemma 2): not one of the supported families",
    "gemma3": "Gemma 3 (local/global rope bases, q/k norms): not one of the supported families",
    "gemma3_text": "Gemma 3 (local/global rope bases, q/k norms): not one of the supported families",
    "mixtral": "mixture-of-experts MLPs are not supported",
    "qwen2_moe": "mixture-of-experts MLPs are not supported",
    "qwen3_moe": "mixture-of-experts MLPs are not supported",
    "phi": "Phi-1/2 (parallel attention, LayerNorm, GELU MLP): not one of the supported families",
    "phimoe": "mixture-of-experts MLPs are not supported",
    "phi3small": "Phi-3-small (block-sparse attention, gegelu): not one of the supported families",
    "gpt2": "learned absolute positions and LayerNorm: not one of the supported families",
    "falcon": "not one of the supported families",
    "deepseek_v3": "multi-head latent attention and mixture-of-experts are not supported",
    "mistral3": "a vision-language model: serve its text model's checkpoint",
}


def family_of(raw: dict, where: str) -> Family:
    """The family of a HF config.json dict; ValueError naming model_type / architectures when not supported."""
    model_type, archs = raw.get("model_type"), raw.get("architectures")
    supported = ", ".join(f"{f.architecture} ({f.model_type})" for f in FAMILIES.values())
    family = FAMILIES.get(model_type)
    if family is None:
        reason = UNSUPPORTED.get(model_type, "not one of the supported families")
        raise ValueError(f"{where}: model_type {model_type!r} / architectures {archs} is not supported ({reason}); "
                         f"supported: {supported}")
    if archs is not None and list(archs) != [family.architecture]:
        raise ValueError(f"{where}: architectures {archs} is not supported for model_type {model_type!r}; "
                         f"only [{family.architecture!r}] (a causal LM head)")
    return family


def check_fields(family: Family, raw: dict, where: str) -> None:
    """Refuse the first config.json field that is unknown, or has a value its family does not serve."""
    for key, value in raw.items():
        how = family.fields.get(key)
        if how is None:
            raise ValueError(f"{where}: config.json field {key}={value!r} is not known for {family.architecture} "
                             f"(it may change the computation); supported fields: {sorted(family.fields)}")
        if isinstance(how, Must) and value not in how.allowed:
            raise ValueError(f"{where}: {family.architecture} with {key}={value!r} is not supported "
                             f"(only {list(how.allowed)}: {how.why})")
