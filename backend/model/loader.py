"""Load a TensorRT-LLM-layout checkpoint directory (config.json + rank0.safetensors) into the torch model.

Built on the meta device, quantized linears swapped in where the checkpoint's quantization block says so
(backend/model/quantized_linear.py), then the file's tensors assigned as stored (float8 / int8 tensors keep their dtype)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from backend.model.causal_lm import CausalLM
from backend.model.config import ModelConfig, load_model_config, torch_dtype
from backend.model.quantized_linear import apply_quantization, prepare_quantized
from backend.model.rotary import RotaryEmbedding

_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}  # safetensors dtype names of float tensors


def load_model(ckpt_dir: Path, device: torch.device, linear_dtype: torch.dtype | None = None) -> CausalLM:
    """The checkpoint's model; with `linear_dtype` (a float checkpoint only), a float32 model whose plain linears'
    weights are held in linear_dtype (bf16: never widened, they are prepacked in it next: prepacked_linear.py;
    float32: the whole model widened)."""
    ckpt_dir = Path(ckpt_dir)
    cfg = load_model_config(ckpt_dir)
    if linear_dtype is not None:
        if cfg.quantization.quantized:
            raise ValueError(f"{ckpt_dir} is quantized ({cfg.quantization}): its linears have their own kernels, "
                             f"not {linear_dtype} ones")
        cfg = dataclasses.replace(cfg, dtype="float32")
    if cfg.mapping.world_size != 1:
        raise ValueError(f"{ckpt_dir} is sharded (mapping {cfg.mapping}): one process per rank loads it "
                         "(backend/parallel), not load_model")
    weights_file = ckpt_dir / "rank0.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file} not found: not a TensorRT-LLM checkpoint directory")
    with torch.device("meta"):
        model = CausalLM(cfg).to(dtype=torch_dtype(cfg))
    model = apply_quantization(model, cfg.quantization, torch_dtype(cfg))
    return load_weights(model, cfg, weights_file, device, linear_dtype)


def load_weights(model: CausalLM, cfg: ModelConfig, weights_file: Path, device: torch.device,
                 linear_dtype: torch.dtype | None = None) -> CausalLM:
    """Assign the file's tensors to a meta-device model whose modules are final (sharded, quantized), check that
    they match exactly, and make it ready to run (rotary embedding, kernels' layouts, fused MLP inputs); plain
    linears' weights in linear_dtype where given."""
    state = load_file(str(weights_file))
    expected = set(model.state_dict().keys())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{weights_file}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
    dtype = torch_dtype(cfg)
    if not cfg.quantization.quantized:
        linears = _plain_linear_weights(model)
        # A float checkpoint runs in its config's dtype; bf16 linears stay bf16 (no float32 copy of them, ever).
        state = {k: v.to(linear_dtype if linear_dtype is not None and k in linears else dtype)
                 for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model = model.to(device=device).eval()
    model.rotary = RotaryEmbedding(model.features.rope, device)
    return prepare_quantized(model).fuse()


def _plain_linear_weights(model: CausalLM) -> set[str]:
    return {f"{name}.weight" for name, m in model.named_modules() if type(m) is nn.Linear}


def widened_bytes(cfg: ModelConfig, ckpt_dir: Path) -> int:
    """Bytes a float checkpoint's tensors grow by when loaded with float32 activations and linears kept in their own
    dtype (load_model's linear_dtype): every tensor but the plain linears' weights (embedding, norms, biases) is
    widened to float32. Read from the file's header and a meta-device model of `cfg`, the checkpoint's config; nothing
    is loaded."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    return _growth(ckpt_dir, _plain_linear_weights(model))


def float32_growth(ckpt_dir: Path) -> int:
    """Bytes a float checkpoint's tensors grow by when every one is widened to float32 (load_model's linear_dtype
    torch.float32), read from the file's header."""
    return _growth(ckpt_dir, set())


def _growth(ckpt_dir: Path, kept: set[str]) -> int:
    """Bytes the file's float tensors grow by when widened to float32, but for those named in `kept`."""
    grown = 0
    with safe_open(str(Path(ckpt_dir) / "rank0.safetensors"), framework="pt") as f:
        for name in f.keys():
            if name not in kept:
                t = f.get_slice(name)
                grown += math.prod(t.get_shape()) * max(0, 4 - _ITEMSIZE.get(t.get_dtype(), 4))
    return grown
