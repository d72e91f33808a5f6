"""The runtime's view of a TensorRT-LLM checkpoint's config.json: the dims the model code needs."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    dtype: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    intermediate_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rotary_base: float

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported (supported: {sorted(_DTYPES)})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x bytes."""
        elem = torch.finfo(self.torch_dtype).bits // 8
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_size * elem

    @classmethod
    def from_checkpoint(cls, ckpt_dir: Path) -> "ModelConfig":
        raw = json.loads((Path(ckpt_dir) / "config.json").read_text())
        mapping = raw.get("mapping") or {}
        if mapping.get("world_size", 1) != 1:
            raise ValueError(f"{ckpt_dir}: sharded checkpoints (mapping {mapping}) are not supported by this runtime yet")
        quant = raw.get("quantization") or {}
        if quant.get("quant_algo") or quant.get("kv_cache_quant_algo"):
            raise ValueError(f"{ckpt_dir}: quantized checkpoints ({quant}) are not supported by this runtime yet")
        heads = raw["num_attention_heads"]
        return cls(
            architecture=raw["architecture"],
            dtype=raw["dtype"],
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_size=raw.get("head_size") or raw["hidden_size"] // heads,
            intermediate_size=raw["intermediate_size"],
            max_position_embeddings=raw["max_position_embeddings"],
            norm_epsilon=raw.get("norm_epsilon", 1e-6),
            rotary_base=raw.get("rotary_base", 10000.0),
        )
