"""The runtime's view of a TensorRT-LLM checkpoint's config.json: the typed config build_engines writes
(backend.formats.checkpoint, which refuses keys and values this runtime does not honour), plus what the runtime
derives from it and refuses in it (quantization it cannot execute, rotary parameters it cannot compute)."""
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
    """The checkpoint's config, refused (ValueError naming the key and value) when anything in it would not be
    honoured: the format's checks, then quantization and the model's features (rotary parameters)."""
    from backend.model.features import DecoderFeatures

    try:
        cfg = TrtllmCheckpointConfig.from_json(Path(ckpt_dir))
        DecoderFeatures.of(cfg)
    except ValueError as exc:
        raise ValueError(f"{ckpt_dir}: {exc}") from None
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


def kv_window(cfg: ModelConfig) -> int | None:
    """The window every layer keeps to (keys p - W < k <= p), so that older KV blocks can be released; None when
    some layer attends to the whole context (Gemma 2's global layers, or no sliding window at all)."""
    windows = cfg.layer_windows
    return None if any(w is None for w in windows) else max(windows)


def position_limit(cfg: ModelConfig) -> int | None:
    """The longest sequence the model's positions are meant for: max_position_embeddings, or None with dynamic NTK
    rope, whose point is to stretch beyond it (max_position_embeddings is where its scaling starts)."""
    scaling = cfg.rotary_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) == "dynamic":
        return None
    return cfg.max_position_embeddings
