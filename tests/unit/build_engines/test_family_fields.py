"""Nothing in a HF config is silently ignored: the walk over every config field of every supported family.

For each family, every field HF transformers 5's config class has is classified (build_engines/hf_families/fields.py),
and each field is exercised with another value:
- READ: the checkpoint converts and our engine's logits equal HF's logits with that value, or the conversion is
  refused with a message naming the field (implemented or refused: never ignored);
- INERT: HF's own logits do not change with the value (so ignoring it is right), and the conversion accepts it;
- Must: a value outside the allowed ones is refused, naming the field and the value.
An unknown field, and the families we do not serve, are refused too.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from backend.model.loader import load_model
from backend.model.scoring import window_logits
from build_engines.convert import convert_hf_to_trtllm
from build_engines.family_fixtures import fixture_config, random_model
from build_engines.hf_families.fields import FAMILIES, INERT, READ, UNSUPPORTED, Must
from build_engines.tokenizer import copy_tokenizer

BASE = {"llama": "llama2", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
        "phi3": "phi3_4k"}
IDENTITY = ("model_type", "architectures")  # checked by family_of (test_unsupported_families_are_refused)
# Output plumbing HF's own causal LMs cannot run with another value (transformers 5 reads .logits off the base
# model's output); the computation does not depend on it, so only its acceptance is checked.
NOT_RUNNABLE = ("return_dict",)
# Config-file keys released checkpoints carry that HF 5's config classes fold into others (rope_theta / rope_scaling
# into rope_parameters, torch_dtype into dtype) or keep as plain attributes some modeling code reads (head_dim when
# present, partial_rotary_factor).
LEGACY = {"rope_theta", "rope_scaling", "torch_dtype", "auto_map", "cache_implementation", "partial_rotary_factor",
          "pretraining_tp", "hidden_act", "attention_bias", "head_dim"}
_LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
             "long_factor": [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0], "original_max_position_embeddings": 32}
# field -> another value (per model type where it has to differ).
VARIANTS: dict[str, object] = {
    "vocab_size": 8300, "hidden_size": 96, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 100,
    "rms_norm_eps": 1e-3, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 3.0},
    "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                        "rope_theta": 1e4},
    "tie_word_embeddings": "flip", "bos_token_id": 5, "eos_token_id": [5, 6], "hidden_act": "gelu",
    "sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1,
    "layer_types": ["full_attention", "sliding_attention"] * 2, "query_pre_attn_scalar": 16,
    "attn_logit_softcapping": 5.0, "final_logit_softcapping": None, "hidden_activation": "gelu",
    "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5,
    # inert
    "_name_or_path": "elsewhere", "transformers_version": "4.0.0", "dtype": "bfloat16", "torch_dtype": "bfloat16",
    "id2label": {0: "a", 1: "b"}, "label2id": {"a": 0, "b": 1}, "problem_type": "regression", "return_dict": False,
    "output_attentions": True, "output_hidden_states": True, "chunk_size_feed_forward": 4, "use_cache": False,
    "initializer_range": 1.0, "attention_dropout": 0.5, "pad_token_id": 7, "auto_map": {"AutoConfig": "x.Config"},
    "cache_implementation": "static", "pretraining_tp": 2, "resid_pdrop": 0.5, "embd_pdrop": 0.5,
    "attention_bias": True,
}
PER_TYPE = {
    "phi3": {"rope_scaling": _LONGROPE, "rope_parameters": {"rope_type": "default", "rope_theta": 300.0},
             "sliding_window": 12},
    "gemma2": {"layer_types": ["full_attention"] * 4, "hidden_act": "relu"},
    "llama": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 1e4}},
}
MUST_BAD = {"is_encoder_decoder": True, "partial_rotary_factor": 0.5, "attention_bias": True, "mlp_bias": True,
            "use_bidirectional_attention": True}
IDS = torch.tensor([[int(x) for x in torch.randint(1, 8000, (40,), generator=torch.Generator().manual_seed(2))]])


def _variant(model_type: str, field: str, base) -> object:
    value = PER_TYPE.get(model_type, {}).get(field, VARIANTS[field])
    return (not getattr(base, "tie_word_embeddings")) if value == "flip" else value


def _save(config, out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    random_model(config, seed).save_pretrained(out, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, out)
    return out


@torch.no_grad()
def _hf_logits(config, state: dict | None = None) -> torch.Tensor:
    model = random_model(config)
    if state is not None:
        model.load_state_dict(state)
    out = model(IDS)
    return (out[0] if isinstance(out, tuple) else out.logits).float()


def _fields():
    for model_type, family in FAMILIES.items():
        for field, how in family.fields.items():
            if field not in IDENTITY:
                yield pytest.param(model_type, field, how, id=f"{model_type}-{field}")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_hf_config_field_is_classified(model_type):
    """HF's config class's fields are all in the table (a new transformers field fails here, not silently), and
    the table holds nothing else but legacy config-file keys."""
    hf_fields = set(AutoConfig.for_model(model_type).to_dict())
    table = set(FAMILIES[model_type].fields)
    assert hf_fields - table == set()
    assert table - hf_fields <= LEGACY


@pytest.mark.parametrize("model_type, field, how", list(_fields()))
def test_field_is_read_inert_or_refused(model_type, field, how, tokenizer_dir, tmp_path):
    base = fixture_config(BASE[model_type], tokenizer_dir, num_hidden_layers=2)
    if isinstance(how, Must):
        raw = {**base.to_dict(), field: MUST_BAD[field]}
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text(json.dumps(raw))
        with pytest.raises(ValueError, match=f"{field}={MUST_BAD[field]!r} is not supported"):
            convert_hf_to_trtllm(tmp_path / "hf", tmp_path / "out")
        return
    value = _variant(model_type, field, base)
    layers = 4 if field in ("layer_types", "num_hidden_layers") else 2
    changed = fixture_config(BASE[model_type], tokenizer_dir, **{"num_hidden_layers": layers, field: value})
    if how == INERT and field in NOT_RUNNABLE:
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**base.to_dict(), field: value}))
        with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):  # accepted up to the (absent) weights
            convert_hf_to_trtllm(tmp_path / "hf", tmp_path / "out")
        return
    if how == INERT:
        reference = fixture_config(BASE[model_type], tokenizer_dir, num_hidden_layers=layers)
        assert torch.equal(_hf_logits(changed, random_model(reference).state_dict()), _hf_logits(reference))
        convert_hf_to_trtllm(_save(changed, tmp_path / "hf", tokenizer_dir), tmp_path / "out")  # accepted
        return
    assert how == READ
    hf_dir = _save(changed, tmp_path / "hf", tokenizer_dir)
    try:
        ckpt = convert_hf_to_trtllm(hf_dir, tmp_path / "out")
    except ValueError as exc:  # refused: the message names what it refuses
        named = {"rope_scaling": "rope", "rope_theta": "rope", "rope_parameters": "rope"}.get(field, field)
        assert named in str(exc)
        return
    want = _hf_logits(changed)
    torch.testing.assert_close(window_logits(load_model(ckpt, torch.device("cpu")), IDS), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_unknown_field_is_refused(model_type, tokenizer_dir, tmp_path):
    (tmp_path / "hf").mkdir()
    raw = {**fixture_config(BASE[model_type], tokenizer_dir).to_dict(), "residual_scale": 0.5}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"config.json field residual_scale=0.5 is not known"):
        convert_hf_to_trtllm(tmp_path / "hf", tmp_path / "out")


@pytest.mark.parametrize("model_type", ["gemma", "gemma3_text", "mixtral", "qwen2_moe", "phi", "gpt2", "falcon"])
def test_unsupported_families_are_refused(model_type, tmp_path):
    (tmp_path / "hf").mkdir()
    raw = AutoConfig.for_model(model_type).to_dict()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(raw, default=str))
    with pytest.raises(ValueError, match=f"model_type '{model_type}' .* is not supported "
                                         f"\\({re.escape(UNSUPPORTED[model_type])}"):
        convert_hf_to_trtllm(tmp_path / "hf", tmp_path / "out")


def test_a_head_other_than_causal_lm_is_refused(tokenizer_dir, tmp_path):
    (tmp_path / "hf").mkdir()
    raw = {**fixture_config("qwen2", tokenizer_dir).to_dict(), "architectures": ["Qwen2ForSequenceClassification"]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"architectures \['Qwen2ForSequenceClassification'\] is not supported"):
        convert_hf_to_trtllm(tmp_path / "hf", tmp_path / "out")
