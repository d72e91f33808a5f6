"""Shape of a Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig


@dataclass(frozen=True)
class LlamaDims:
    """Model dimensions; head_dim is derived as hidden_size // num_heads.

    The defaults are the demo model: 8 heads of 32 (a power of two, which GPU attention
    kernels like) sharing 4 KV heads, so tensor parallel sizes 1, 2 and 4 split it evenly.
    Width 256, not wider: with a few minutes of CPU training the loss is bound by tokens
    seen, and at equal tokens a 384-wide model reached the same loss 1.4-2.5x slower.
    A 1024-wide MLP brings the whole model (untied 8192-token vocabulary) to ~10.1M parameters.
    """

    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even: RoPE rotates pairs of channels")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError(f"rope_theta and rms_norm_eps must be positive, "
                             f"got {self.rope_theta}, {self.rms_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_hf_config(self, vocab_size: int, endoftext_id: int, initializer_range: float = 0.02) -> LlamaConfig:
        """HF config with an untied lm_head; bos, eos and pad are all the end-of-text token."""
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            initializer_range=initializer_range,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=endoftext_id,
            eos_token_id=endoftext_id,
            pad_token_id=endoftext_id,
        )
