"""Load a TensorRT-LLM-layout checkpoint directory (config.json + rank0.safetensors) into the torch model.

Built on the meta device, quantized linears swapped in where the checkpoint's quantization block says so
(backend/model/quantized_linear.py), then the file's tensors assigned as stored (float8 / int8 tensors keep their dtype)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file

from backend.model.causal_lm import CausalLM
from backend.model.config import ModelConfig, load_model_config, torch_dtype
from backend.model.quantized_linear import apply_quantization, prepare_quantized
from backend.model.rotary import RotaryEmbedding


def load_model(ckpt_dir: Path, device: torch.device, dtype: str | None = None) -> CausalLM:
    """The checkpoint's model, in `dtype` instead of its config's where given (a float checkpoint only)."""
    ckpt_dir = Path(ckpt_dir)
    cfg = load_model_config(ckpt_dir)
    if dtype is not None:
        if cfg.quantization.quant_algo or cfg.quantization.kv_cache_quant_algo:
            raise ValueError(f"{ckpt_dir} is quantized ({cfg.quantization}): it runs in its own dtype, not {dtype}")
        cfg = dataclasses.replace(cfg, dtype=dtype)
    if cfg.mapping.world_size != 1:
        raise ValueError(f"{ckpt_dir} is sharded (mapping {cfg.mapping}): one process per rank loads it "
                         "(backend/parallel), not load_model")
    weights_file = ckpt_dir / "rank0.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file} not found: not a TensorRT-LLM checkpoint directory")
    with torch.device("meta"):
        model = CausalLM(cfg).to(dtype=torch_dtype(cfg))
    model = apply_quantization(model, cfg.quantization, torch_dtype(cfg))
    return load_weights(model, cfg, weights_file, device)


def load_weights(model: CausalLM, cfg: ModelConfig, weights_file: Path, device: torch.device) -> CausalLM:
    """Assign the file's tensors to a meta-device model whose modules are final (sharded, quantized), check that
    they match exactly, and make it ready to run (rotary embedding, kernels' layouts, fused MLP inputs)."""
    state = load_file(str(weights_file))
    expected = set(model.state_dict().keys())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{weights_file}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
    dtype = torch_dtype(cfg)
    if not (cfg.quantization.quant_algo or cfg.quantization.kv_cache_quant_algo):
        state = {k: v.to(dtype) for k, v in state.items()}  # a float checkpoint runs in its config's dtype
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device=device).eval()
    model.rotary = RotaryEmbedding(model.features.rope, device)
    return prepare_quantized(model).fuse()
