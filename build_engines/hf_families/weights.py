"""HF tensors -> TensorRT-LLM 1.2.x tensors, per family (names: backend/formats/checkpoint_tensors.py).

- q/k/v projections are concatenated into attention.qkv (rows q, k, v; Phi-3's qkv_proj already is), their
  biases (Qwen2) into attention.qkv.bias; Qwen3's self_attn.q_norm / k_norm become attention.q/k_layernorm;
- mlp.fc = gate_proj (activated), mlp.gate = up_proj; Phi-3's gate_up_proj ([gate | up] rows) becomes mlp.fc with
  its halves swapped, [up | gate], as TRT-LLM's swiglu takes the second half as the gate;
- Gemma 2 norms are stored as 1 + w (computed in float32), as TRT-LLM's converter does, and its four per-layer
  norms map to input_layernorm, post_layernorm (post-attention), pre/post_feedforward_layernorm;
- a tied lm_head (absent from HF's files) is written as a copy of the embedding (safetensors cannot alias).
"""
from __future__ import annotations

import torch

from backend.formats.checkpoint import LM_HEAD, LN_F, VOCAB_EMBEDDING, TrtllmCheckpointConfig
from backend.formats.checkpoint_tensors import LayerNames, expected_shapes

# HF per-layer tensor (after "model.layers.{i}.") -> LayerNames field, for plain renames.
_RENAMES = {
    "input_layernorm.weight": "input_layernorm",
    "self_attn.o_proj.weight": "dense",
    "post_attention_layernorm.weight": "post_layernorm",
    "pre_feedforward_layernorm.weight": "pre_feedforward_layernorm",
    "post_feedforward_layernorm.weight": "post_feedforward_layernorm",
    "self_attn.q_norm.weight": "q_layernorm",
    "self_attn.k_norm.weight": "k_layernorm",
    "mlp.gate_proj.weight": "mlp_fc",  # the activated branch
    "mlp.up_proj.weight": "mlp_gate",  # the linear branch
    "mlp.down_proj.weight": "mlp_proj",
}
_GEMMA_NORMS = ("input_layernorm", "post_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


class _Source:
    """The HF tensors, consumed as they are taken, so that leftovers (tensors nobody maps) can be refused."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ValueError(f"HF checkpoint lacks tensor {name!r}")
        return self.tensors.pop(name)

    def has(self, name: str) -> bool:
        return name in self.tensors


def convert_weights(hf: dict[str, torch.Tensor], cfg: TrtllmCheckpointConfig, dtype: torch.dtype,
                    progress=lambda it: it) -> dict[str, torch.Tensor]:
    """Rename / fuse HF tensors into TRT-LLM names, cast to dtype. Consumes `hf`; raises if a tensor is missing,
    left over, or of the wrong shape."""
    src = _Source(hf)
    out = {VOCAB_EMBEDDING: src.take("model.embed_tokens.weight")}
    for i in progress(range(cfg.num_hidden_layers)):
        out.update(_layer(src, i, cfg))
    out[LN_F] = src.take("model.norm.weight")
    out[LM_HEAD] = src.take("lm_head.weight") if src.has("lm_head.weight") else out[VOCAB_EMBEDDING].clone()
    if cfg.gemma2 is not None:
        out[LN_F] = out[LN_F].float() + 1.0
    leftover = sorted(k for k in src.tensors if not k.endswith("rotary_emb.inv_freq"))
    if leftover:
        raise ValueError(f"HF checkpoint has tensors this converter does not map (a feature this family's config "
                         f"does not declare?): {leftover[:6]}")
    expected = expected_shapes(cfg)
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"HF checkpoint lacks tensors the config needs: {missing[:6]}")
    for name, shape in expected.items():
        if tuple(out[name].shape) != shape:
            raise ValueError(f"{name}: shape {tuple(out[name].shape)} does not match the config ({shape})")
    return {name: t.to(dtype).contiguous() for name, t in out.items()}


def _layer(src: _Source, i: int, cfg: TrtllmCheckpointConfig) -> dict[str, torch.Tensor]:
    p, names = f"model.layers.{i}.", LayerNames.of(i)
    out: dict[str, torch.Tensor] = {}
    if src.has(p + "self_attn.qkv_proj.weight"):
        out[names.qkv] = src.take(p + "self_attn.qkv_proj.weight")  # already rows q, k, v
    else:
        out[names.qkv] = torch.cat([src.take(f"{p}self_attn.{x}_proj.weight") for x in "qkv"], dim=0)
    if cfg.attn_bias:
        out[names.qkv_bias] = torch.cat([src.take(f"{p}self_attn.{x}_proj.bias") for x in "qkv"], dim=0)
    if src.has(p + "mlp.gate_up_proj.weight"):
        gate, up = src.take(p + "mlp.gate_up_proj.weight").chunk(2, dim=0)
        out[names.mlp_fc] = torch.cat([up, gate], dim=0)
    for hf_name, field in _RENAMES.items():
        if src.has(p + hf_name):
            out[getattr(names, field)] = src.take(p + hf_name)
    if cfg.gemma2 is not None:
        for field in _GEMMA_NORMS:
            name = getattr(names, field)
            out[name] = out[name].float() + 1.0  # TRT-LLM's Gemma norms multiply by the stored weight
    return out
