"""Load a TensorRT-LLM-layout checkpoint directory (config.json + rank0.safetensors) into the torch model."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from backend.model import LlamaForCausalLM
from backend.model_config import load_model_config, torch_dtype


def load_model(ckpt_dir: Path, device: torch.device) -> LlamaForCausalLM:
    ckpt_dir = Path(ckpt_dir)
    cfg = load_model_config(ckpt_dir)
    if cfg.mapping.world_size != 1:
        raise ValueError(f"{ckpt_dir} is sharded (mapping {cfg.mapping}): one process per rank loads it "
                         "(backend/parallel), not load_model")
    weights_file = ckpt_dir / "rank0.safetensors"
    if not weights_file.is_file():
        raise FileNotFoundError(f"{weights_file} not found: not a TensorRT-LLM checkpoint directory")
    model = LlamaForCausalLM(cfg)
    state = load_file(str(weights_file))
    expected = set(model.state_dict().keys())
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"{weights_file}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=torch_dtype(cfg)).eval().fuse()
