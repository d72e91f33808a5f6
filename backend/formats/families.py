"""Which decoder families a checkpoint may declare, and which keys and values each one may carry.

One rule per TensorRT-LLM 1.2 architecture name. A rule lists the values its keys may take; a value outside them
is refused at load (and at conversion, which builds the same config) with the key, the value and the reason,
so no checkpoint runs with a setting this runtime would not honour. Everything else about a family is decided
by its keys, not its name (backend/model/features.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.formats.checkpoint import TrtllmCheckpointConfig

ROTARY_SCALING_TYPES = ("linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class FamilyRule:
    hidden_act: tuple[str, ...]
    position_embedding_type: tuple[str, ...] = ("rope_gpt_neox",)
    attn_bias: tuple[bool, ...] = (False,)
    qk_layernorm: tuple[bool, ...] = (False,)
    qwen_type: tuple[str | None, ...] = (None,)
    gemma2: bool = False  # the Gemma2 group must be present (True) or absent (False)
    partial_rotary: bool = False  # rotary_pct below 1 allowed
    layer_types: bool = True  # sliding layers allowed
    why: str = ""  # what the family's TRT-LLM model hard-codes, for the messages


FAMILIES: dict[str, FamilyRule] = {
    "LlamaForCausalLM": FamilyRule(("silu",), why="Llama: SiLU gated MLP; attention and MLP biases not supported"),
    "MistralForCausalLM": FamilyRule(("silu",), why="Mistral: SiLU gated MLP, no biases"),
    "Qwen2ForCausalLM": FamilyRule(("silu",), attn_bias=(True,), qwen_type=("qwen2",),
                                   why="Qwen2: SiLU gated MLP, q/k/v biases, no o_proj bias"),
    "Qwen3ForCausalLM": FamilyRule(("silu",), qk_layernorm=(True,), qwen_type=("qwen3",),
                                   why="Qwen3: SiLU gated MLP, q/k RMSNorm, no attention bias"),
    "Gemma2ForCausalLM": FamilyRule(("gelu_pytorch_tanh",), gemma2=True,
                                    why="Gemma 2: GeLU-tanh gated MLP, sandwich norms, soft-capping, no biases"),
    "Phi3ForCausalLM": FamilyRule(("swiglu",), position_embedding_type=("rope_gpt_neox", "long_rope"),
                                  partial_rotary=True, why="Phi-3: fused qkv and SwiGLU gate/up, no biases"),
}


def check_family(cfg: TrtllmCheckpointConfig) -> None:
    """Raise ValueError naming the first key whose value the architecture's rule does not allow."""
    rule = FAMILIES.get(cfg.architecture)
    if rule is None:
        raise ValueError(f"architecture {cfg.architecture!r} is not supported; supported: {sorted(FAMILIES)}")
    for key in ("hidden_act", "position_embedding_type", "attn_bias", "qk_layernorm", "qwen_type"):
        value, allowed = getattr(cfg, key), getattr(rule, key)
        if value not in allowed:
            raise ValueError(f"{cfg.architecture}: {key} {value!r} is not supported (allowed: {list(allowed)}; "
                             f"{rule.why})")
    if cfg.mlp_bias:
        raise ValueError(f"{cfg.architecture}: mlp_bias true is not supported by this runtime")
    if (cfg.gemma2 is not None) != rule.gemma2:
        raise ValueError(f"{cfg.architecture}: the Gemma 2 keys (query_pre_attn_scalar, *_logit_softcapping, "
                         f"inter_layernorms) must be {'present' if rule.gemma2 else 'absent'}")
    if cfg.gemma2 is not None and not cfg.gemma2.inter_layernorms:
        raise ValueError(f"{cfg.architecture}: inter_layernorms false is not supported (Gemma 2 normalises the "
                         f"attention and MLP outputs)")
    if not 0.0 < cfg.rotary_pct <= 1.0 or (cfg.rotary_pct != 1.0 and not rule.partial_rotary):
        raise ValueError(f"{cfg.architecture}: rotary_pct {cfg.rotary_pct} is not supported "
                         f"({'in (0, 1]' if rule.partial_rotary else 'only 1.0: this family rotates whole heads'})")
    if cfg.rotary_dim % 2:
        raise ValueError(f"rotary dimension {cfg.rotary_dim} (head_size x rotary_pct) must be even")
    _check_rope(cfg)


def _check_rope(cfg: TrtllmCheckpointConfig) -> None:
    long_rope = cfg.position_embedding_type == "long_rope"
    if long_rope != (cfg.longrope is not None):
        raise ValueError("position_embedding_type long_rope and the longrope_* keys (original_max_position_embeddings,"
                         " longrope_scaling_short_factors, longrope_scaling_long_factors) go together")
    if cfg.longrope is not None and len(cfg.longrope.longrope_scaling_short_factors) != cfg.rotary_dim // 2:
        raise ValueError(f"longrope factor lists have {len(cfg.longrope.longrope_scaling_short_factors)} entries; "
                         f"the rotary dimension {cfg.rotary_dim} needs {cfg.rotary_dim // 2}")
    if cfg.rotary_scaling is None:
        return
    if long_rope:
        raise ValueError("rotary_scaling must be null with position_embedding_type long_rope")
    kind = cfg.rotary_scaling.get("type", cfg.rotary_scaling.get("rope_type"))
    if kind not in ROTARY_SCALING_TYPES:
        raise ValueError(f"rotary_scaling type {kind!r} is not supported (supported: {list(ROTARY_SCALING_TYPES)}, "
                         f"or null)")
