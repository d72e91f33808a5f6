"""Convert a HF Llama checkpoint directory into a TensorRT-LLM checkpoint (single rank)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import LlamaConfig

from backend.formats.checkpoint import (
    CONFIG_FILE,
    DTYPES,
    LM_HEAD,
    LN_F,
    VOCAB_EMBEDDING,
    LayerNames,
    TrtllmCheckpointConfig,
    rank_file,
)
from build_engines.cache import atomic_dir

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# HF per-layer tensor (after "model.layers.{i}.") -> LayerNames field, for plain renames.
# q/k/v are not here: they are concatenated into one qkv tensor.
LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm",
    "self_attn.o_proj.weight": "dense",
    "post_attention_layernorm.weight": "post_layernorm",
    "mlp.gate_proj.weight": "mlp_fc",  # the SiLU branch
    "mlp.up_proj.weight": "mlp_gate",  # the linear branch
    "mlp.down_proj.weight": "mlp_proj",
}


def convert_hf_to_trtllm(hf_dir: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """Write out_dir/config.json and out_dir/rank0.safetensors (replacing out_dir atomically)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config = checkpoint_config_from_hf(hf_dir, dtype)
    weights = convert_weights(load_hf_weights(hf_dir), config)
    with atomic_dir(out_dir) as tmp:
        config.to_json(tmp / CONFIG_FILE)
        save_file(weights, str(tmp / rank_file(0)), metadata={"format": "pt"})
    return out_dir


def checkpoint_config_from_hf(hf_dir: Path, dtype: str = "float32") -> TrtllmCheckpointConfig:
    """The TRT-LLM config for the HF Llama in `hf_dir`, with weights stored as `dtype`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    raw = _read_hf_config(hf_dir)
    hf = LlamaConfig.from_pretrained(hf_dir)
    if getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
        raise ValueError(f"{hf_dir}: Llama with attention/MLP biases is not supported")
    if hf.hidden_act != "silu":
        raise ValueError(f"{hf_dir}: hidden_act {hf.hidden_act!r} is not supported (only 'silu')")
    rotary_base, rotary_scaling = _rope(hf)
    return TrtllmCheckpointConfig(
        architecture="LlamaForCausalLM",
        dtype=dtype,
        vocab_size=hf.vocab_size,
        max_position_embeddings=hf.max_position_embeddings,
        hidden_size=hf.hidden_size,
        num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=hf.num_key_value_heads or hf.num_attention_heads,
        head_size=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        intermediate_size=hf.intermediate_size,
        norm_epsilon=hf.rms_norm_eps,
        rotary_base=rotary_base,
        rotary_scaling=rotary_scaling,
        bos_token_id=_single_id(raw.get("bos_token_id")),
        eos_token_id=_single_id(raw.get("eos_token_id")),
    )


def load_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of the HF checkpoint (one file, or the shards its index names)."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(hf_dir.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no *.safetensors weights found")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(str(hf_dir / name)))
    return weights


def convert_weights(hf: dict[str, torch.Tensor], config: TrtllmCheckpointConfig) -> dict[str, torch.Tensor]:
    """Rename (and fuse q/k/v) HF tensors into TRT-LLM names, cast to config.dtype.

    Consumes `hf`; raises if a tensor is missing, left over, or of the wrong shape.
    """
    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"HF checkpoint lacks tensor {name!r}")
        return hf.pop(name)

    out = {VOCAB_EMBEDDING: take("model.embed_tokens.weight")}
    for i in tqdm(range(config.num_hidden_layers), desc="convert", unit="layer"):
        prefix, names = f"model.layers.{i}.", LayerNames.of(i)
        # (n_heads*head + 2*n_kv*head, hidden): q rows, then k rows, then v rows
        out[names.qkv] = torch.cat([take(f"{prefix}self_attn.{p}_proj.weight") for p in "qkv"], dim=0)
        for hf_name, field_name in LAYER_RENAMES.items():
            out[getattr(names, field_name)] = take(prefix + hf_name)
    out[LN_F] = take("model.norm.weight")
    # Tied checkpoints store no lm_head; write a copy (safetensors cannot alias tensors).
    out[LM_HEAD] = hf.pop("lm_head.weight") if "lm_head.weight" in hf else out[VOCAB_EMBEDDING].clone()
    leftover = sorted(k for k in hf if not k.endswith("rotary_emb.inv_freq"))
    if leftover:
        raise ValueError(f"HF checkpoint has tensors this converter does not map: {leftover[:6]}")
    _check_shapes(out, config)
    dtype = TORCH_DTYPES[config.dtype]
    return {name: t.to(dtype).contiguous() for name, t in out.items()}


def _check_shapes(weights: dict[str, torch.Tensor], config: TrtllmCheckpointConfig) -> None:
    for name, shape in config.expected_shapes().items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(weights[name].shape)} does not match config ({shape})")


def _read_hf_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (not a HF checkpoint directory)")
    raw = json.loads(path.read_text())
    if raw.get("model_type") != "llama" or raw.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]:
        raise ValueError(f"{hf_dir}: model_type {raw.get('model_type')!r} / architectures "
                         f"{raw.get('architectures')} is not supported; only LlamaForCausalLM")
    return raw


def _rope(hf: LlamaConfig) -> tuple[float, dict | None]:
    """(rotary_base, rotary_scaling) from transformers 5's rope_parameters or 4.x's fields."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    if not params:
        params = {"rope_theta": getattr(hf, "rope_theta", 10000.0), **(getattr(hf, "rope_scaling", None) or {})}
    base = float(params.pop("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    return base, (None if kind == "default" else params)


def _single_id(value: int | list[int] | None) -> int | None:
    """HF allows a list of eos ids; TRT-LLM's config holds one (the first)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value
