"""The decoder, described by the features a checkpoint declares (its config keys), not by its family's name.

Llama, Mistral, Qwen2/3, Gemma 2 and Phi-3 are one decoder with different switches: biases, q/k norms, sandwich
norms, norm arithmetic, embedding scale, attention scale and soft-caps, activation, fused gate/up, rotary variant,
per-layer sliding windows. backend/model/decoder.py builds modules from these; nothing there tests a family name.
"""
from __future__ import annotations

from dataclasses import dataclass

from backend.formats.checkpoint import TrtllmCheckpointConfig
from backend.formats.checkpoint_tensors import fused_gate_up
from backend.model.rope import RopeSpec

ACTIVATIONS = {"silu": "silu", "swiglu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class AttentionFeatures:
    hidden: int
    n_heads: int
    n_kv: int
    head_dim: int
    qkv_bias: bool  # q, k, v projections carry a bias (Qwen2)
    qk_norm: bool  # per-head RMSNorm (one (head_dim,) weight) of q and k before RoPE (Qwen3)
    norm_eps: float
    scale: float  # scores = q . k * scale: head_dim ** -0.5, or query_pre_attn_scalar ** -0.5 (Gemma 2)
    softcap: float | None  # scores -> tanh(scores / cap) * cap before the mask (Gemma 2)


@dataclass(frozen=True)
class MlpFeatures:
    hidden: int
    intermediate: int
    activation: str  # "silu" | "gelu_tanh", applied to the fc (HF gate_proj) branch
    fused: bool  # fc holds [up | gate] rows in one (2 * intermediate, hidden) weight (Phi-3)


@dataclass(frozen=True)
class DecoderFeatures:
    vocab_size: int
    attention: AttentionFeatures
    mlp: MlpFeatures
    norm_eps: float
    norm_weight_in_float32: bool  # Gemma: out = (x_normed * w) in float32, then cast; Llama: w * x_normed.to(dtype)
    sandwich_norms: bool  # Gemma 2: the attention and MLP outputs are normalised too, and the MLP has its own input norm
    embedding_scale: float | None  # inputs embeddings times sqrt(hidden) in the weights' dtype (Gemma)
    final_softcap: float | None  # logits -> tanh(logits / cap) * cap (Gemma 2)
    windows: tuple[int | None, ...]  # per layer: sliding window W (keys p - W < k <= p), None for full attention
    rope: RopeSpec

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @classmethod
    def of(cls, cfg: TrtllmCheckpointConfig) -> DecoderFeatures:
        g = cfg.gemma2
        scale = (g.query_pre_attn_scalar if g is not None else cfg.head_size) ** -0.5
        attention = AttentionFeatures(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                      cfg.head_size, qkv_bias=cfg.attn_bias, qk_norm=cfg.qk_layernorm,
                                      norm_eps=cfg.norm_epsilon, scale=scale,
                                      softcap=g.attn_logit_softcapping if g is not None else None)
        mlp = MlpFeatures(cfg.hidden_size, cfg.intermediate_size, ACTIVATIONS[cfg.hidden_act], fused_gate_up(cfg))
        return cls(vocab_size=cfg.vocab_size, attention=attention, mlp=mlp, norm_eps=cfg.norm_epsilon,
                   norm_weight_in_float32=g is not None, sandwich_norms=g is not None,
                   embedding_scale=cfg.hidden_size ** 0.5 if g is not None else None,
                   final_softcap=g.final_logit_softcapping if g is not None else None,
                   windows=cfg.layer_windows, rope=RopeSpec.of(cfg))
