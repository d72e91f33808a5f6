"""The runtime's view of a TensorRT-LLM checkpoint's config.json: the typed config build_engines writes
(backend.formats.checkpoint), plus what the runtime derives from it and refuses in it."""
from __future__ import annotations

from pathlib import Path

import torch

from backend.formats.checkpoint import TrtllmCheckpointConfig

ModelConfig = TrtllmCheckpointConfig

# What backend/model/quantized_linear.py and backend/model/quantized_kv.py execute.
SUPPORTED_QUANT_ALGOS = (None, "FP8", "W4A16_AWQ", "W8A16")
SUPPORTED_KV_QUANT_ALGOS = (None, "FP8")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_model_config(ckpt_dir: Path) -> ModelConfig:
    cfg = TrtllmCheckpointConfig.from_json(Path(ckpt_dir))
    quant = cfg.quantization
    if quant.quant_algo not in SUPPORTED_QUANT_ALGOS or quant.kv_cache_quant_algo not in SUPPORTED_KV_QUANT_ALGOS:
        raise ValueError(f"{ckpt_dir}: quantization {quant} is not supported by this runtime (quant_algo one of "
                         f"{SUPPORTED_QUANT_ALGOS}, kv_cache_quant_algo one of {SUPPORTED_KV_QUANT_ALGOS})")
    return cfg


def torch_dtype(cfg: ModelConfig) -> torch.dtype:
    return _DTYPES[cfg.dtype]


def kv_bytes_per_token(cfg: ModelConfig) -> int:
    """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x bytes (1 with an FP8 KV cache)."""
    itemsize = 1 if cfg.quantization.kv_cache_quant_algo == "FP8" else torch_dtype(cfg).itemsize
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_size * itemsize
