"""Tensor names and shapes of a TensorRT-LLM 1.2.x checkpoint, by the config keys that add or fuse tensors.

Names and the MLP mapping match TensorRT-LLM's converters (tensorrt_llm/models/{llama,qwen,gemma,phi3}/convert.py)
and its GatedMLP / FusedGatedMLP (tensorrt_llm/layers/mlp.py):
- `attention.qkv` rows are q heads, then k heads, then v heads; `attention.qkv.bias` with attn_bias (Qwen2);
- `mlp.fc` is the projection that goes through the activation (HF gate_proj), `mlp.gate` the one it multiplies
  (HF up_proj): out = proj(act(fc(x)) * gate(x)). With hidden_act "swiglu" (Phi-3) there is no mlp.gate: `mlp.fc`
  is (2 * intermediate, hidden) with rows [up | gate], and out = proj(up * silu(gate)) (TRT-LLM's swiglu);
- `post_layernorm` normalises the MLP input (Llama), or with inter_layernorms (Gemma 2) the attention output,
  beside `pre_feedforward_layernorm` (MLP input) and `post_feedforward_layernorm` (MLP output);
- `attention.q_layernorm` / `attention.k_layernorm` (head_size,) with qk_layernorm (Qwen3).
Every weight is (out_features, in_features), as in torch.nn.Linear.
"""
from __future__ import annotations

from dataclasses import dataclass

from backend.formats.checkpoint import LM_HEAD, LN_F, VOCAB_EMBEDDING, TrtllmCheckpointConfig, layer_prefix

GATED_FUSED_ACTS = ("swiglu",)  # hidden_act values whose checkpoint fuses gate and up into mlp.fc


@dataclass(frozen=True)
class LayerNames:
    """Tensor names of decoder layer i (those a given config does not have are simply not written)."""

    input_layernorm: str
    qkv: str  # rows: q heads, then k heads, then v heads
    qkv_bias: str
    q_layernorm: str
    k_layernorm: str
    dense: str  # attention output projection (HF o_proj)
    post_layernorm: str
    pre_feedforward_layernorm: str
    post_feedforward_layernorm: str
    mlp_fc: str  # HF gate_proj, goes through the activation (fused: rows [up | gate])
    mlp_gate: str  # HF up_proj, multiplies act(fc(x))
    mlp_proj: str  # HF down_proj

    @classmethod
    def of(cls, i: int) -> LayerNames:
        p = layer_prefix(i)
        return cls(input_layernorm=f"{p}input_layernorm.weight", qkv=f"{p}attention.qkv.weight",
                   qkv_bias=f"{p}attention.qkv.bias", q_layernorm=f"{p}attention.q_layernorm.weight",
                   k_layernorm=f"{p}attention.k_layernorm.weight", dense=f"{p}attention.dense.weight",
                   post_layernorm=f"{p}post_layernorm.weight",
                   pre_feedforward_layernorm=f"{p}pre_feedforward_layernorm.weight",
                   post_feedforward_layernorm=f"{p}post_feedforward_layernorm.weight",
                   mlp_fc=f"{p}mlp.fc.weight", mlp_gate=f"{p}mlp.gate.weight", mlp_proj=f"{p}mlp.proj.weight")


def fused_gate_up(cfg: TrtllmCheckpointConfig) -> bool:
    return cfg.hidden_act in GATED_FUSED_ACTS


def qkv_split_sizes(cfg: TrtllmCheckpointConfig) -> tuple[int, int, int]:
    """Rows of the fused qkv weight taken by q, k and v (unsharded)."""
    kv_rows = cfg.num_key_value_heads * cfg.head_size
    return cfg.num_attention_heads * cfg.head_size, kv_rows, kv_rows


def expected_shapes(cfg: TrtllmCheckpointConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of an unsharded, unquantized checkpoint, by name."""
    h, inter, vocab, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_size
    shapes: dict[str, tuple[int, ...]] = {VOCAB_EMBEDDING: (vocab, h), LN_F: (h,), LM_HEAD: (vocab, h)}
    qkv_rows = sum(qkv_split_sizes(cfg))
    for i in range(cfg.num_hidden_layers):
        n = LayerNames.of(i)
        shapes.update({n.input_layernorm: (h,), n.qkv: (qkv_rows, h), n.dense: (h, cfg.num_attention_heads * d),
                       n.post_layernorm: (h,), n.mlp_proj: (h, inter)})
        if cfg.attn_bias:
            shapes[n.qkv_bias] = (qkv_rows,)
        if cfg.qk_layernorm:
            shapes.update({n.q_layernorm: (d,), n.k_layernorm: (d,)})
        if cfg.gemma2 is not None:
            shapes.update({n.pre_feedforward_layernorm: (h,), n.post_feedforward_layernorm: (h,)})
        if fused_gate_up(cfg):
            shapes[n.mlp_fc] = (2 * inter, h)
        else:
            shapes.update({n.mlp_fc: (inter, h), n.mlp_gate: (inter, h)})
    return shapes
