"""Keys of a TensorRT-LLM checkpoint config that belong together (present together or absent), written flat in
config.json as TRT-LLM writes them (its Gemma2ConfigGroup is the model for this)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gemma2Keys:
    """TRT-LLM's Gemma2ConfigGroup plus `inter_layernorms` (the post-attention / pre- and post-feed-forward norms)."""

    query_pre_attn_scalar: float  # attention scores are scaled by query_pre_attn_scalar ** -0.5
    attn_logit_softcapping: float | None  # scores -> tanh(scores / cap) * cap before the mask
    final_logit_softcapping: float | None  # logits -> tanh(logits / cap) * cap
    inter_layernorms: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.query_pre_attn_scalar, (int, float)) or self.query_pre_attn_scalar <= 0:
            raise ValueError(f"query_pre_attn_scalar must be a number > 0, got {self.query_pre_attn_scalar!r}")
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"{name} must be a number > 0 or null, got {value!r}")


@dataclass(frozen=True)
class LongRopeKeys:
    """position_embedding_type long_rope (Phi-3): per-frequency divisors, short below the original length, long above."""

    original_max_position_embeddings: int
    longrope_scaling_short_factors: tuple[float, ...]
    longrope_scaling_long_factors: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "longrope_scaling_short_factors", tuple(self.longrope_scaling_short_factors))
        object.__setattr__(self, "longrope_scaling_long_factors", tuple(self.longrope_scaling_long_factors))
        if len(self.longrope_scaling_short_factors) != len(self.longrope_scaling_long_factors):
            raise ValueError("longrope_scaling_short_factors and longrope_scaling_long_factors differ in length")
        if self.original_max_position_embeddings < 1:
            raise ValueError(f"original_max_position_embeddings must be >= 1, got "
                             f"{self.original_max_position_embeddings}")
