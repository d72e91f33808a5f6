"""Split a single-rank TensorRT-LLM checkpoint into tp_size x pp_size rank files, by TensorRT-LLM 1.2.x's rules.

Per rank (tp_rank t of tp_size, stage p of pp_size; rank = p * tp_size + t, see rank_layout.py):
- layers: the stage's range (rank_layout.pp_layers), renamed from 0 in each file, as TRT-LLM's converters do;
- attention.qkv (column-parallel): q, k and v each split by heads; when tp > kv heads, each KV head is first
  repeated tp / kv_heads times, so every rank holds one (replicated) KV head;
- mlp.fc, mlp.gate (column-parallel): split by output rows; attention.dense, mlp.proj (row-parallel): split
  by input columns; their partial outputs are summed (all_reduce) at run time;
- vocab_embedding: whole, on the first stage (use_parallel_embedding false); ln_f and lm_head on the last
  stage, lm_head rows padded with zeros to a multiple of tp and split by vocabulary;
- layer norms and per-tensor (scalar) quantization scales: replicated.
A quantized checkpoint shards when all its scales are per-tensor (FP8, FP8 KV cache); per-channel or group
scales and packed weights (W8A16, W4A16_AWQ) are refused with an error naming the tensor.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .cache import atomic_dir
from .checkpoint_format import (CONFIG_FILE, LM_HEAD, LN_F, VOCAB_EMBEDDING, TrtllmCheckpointConfig, layer_prefix,
                                rank_file)
from .rank_layout import RankPosition, check_tp, kv_heads_per_rank, padded_vocab, pp_layers

# Weight suffixes inside a layer and the dimension they are split along (None: replicated).
_LAYER_SPLITS: dict[str, int | None] = {
    "input_layernorm.weight": None,
    "post_layernorm.weight": None,
    "attention.qkv.weight": 0,  # by heads, see split_qkv
    "attention.dense.weight": 1,
    "mlp.fc.weight": 0,
    "mlp.gate.weight": 0,
    "mlp.proj.weight": 1,
}


def shard_checkpoint(src_dir: Path, dst_dir: Path, tp_size: int, pp_size: int) -> Path:
    """Write dst_dir/config.json (with `mapping`) and dst_dir/rank{N}.safetensors for every rank; return dst_dir.

    src_dir is an unsharded checkpoint (config.json + rank0.safetensors, as convert.py writes). Raises
    ValueError, before writing anything, when the model cannot be split this way (and says what would work)."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    raw = json.loads((src_dir / CONFIG_FILE).read_text())
    cfg = TrtllmCheckpointConfig.from_dict(raw)
    check_shardable(cfg, tp_size, pp_size)
    weights = load_file(str(src_dir / rank_file(0)))
    _check_tensors(weights, cfg)
    with atomic_dir(dst_dir) as tmp:
        for rank in range(tp_size * pp_size):
            shard = shard_weights(weights, cfg, RankPosition(rank, tp_size, pp_size))
            save_file(shard, str(tmp / rank_file(rank)), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(sharded_config(raw, tp_size, pp_size), indent=2) + "\n")
    return dst_dir


def check_shardable(cfg: TrtllmCheckpointConfig, tp_size: int, pp_size: int) -> None:
    if tp_size < 1 or pp_size < 1:
        raise ValueError(f"tp_size and pp_size must be >= 1, got tp {tp_size}, pp {pp_size}")
    if cfg.mapping.world_size != 1:
        raise ValueError(f"the source checkpoint is already sharded (mapping {cfg.mapping}); shard an unsharded one")
    check_tp(cfg.num_attention_heads, cfg.num_key_value_heads, tp_size)
    if pp_size > cfg.num_hidden_layers:
        raise ValueError(f"pp_size {pp_size} exceeds num_hidden_layers ({cfg.num_hidden_layers}): "
                         f"every pipeline stage needs a layer; use pp_size <= {cfg.num_hidden_layers}")


def sharded_config(raw: dict, tp_size: int, pp_size: int) -> dict:
    """config.json with TRT-LLM's rank-independent mapping fields (every other key kept as it was)."""
    out = dict(raw)
    out["mapping"] = {"world_size": tp_size * pp_size, "gpus_per_node": 8, "cp_size": 1, "tp_size": tp_size,
                      "pp_size": pp_size, "moe_tp_size": tp_size, "moe_ep_size": 1}
    out.setdefault("use_parallel_embedding", False)
    return out


def shard_weights(weights: dict[str, torch.Tensor], cfg: TrtllmCheckpointConfig,
                  pos: RankPosition) -> dict[str, torch.Tensor]:
    """The tensors of one rank, named as that rank's file names them."""
    out: dict[str, torch.Tensor] = {}
    if pos.is_first_stage:
        out[VOCAB_EMBEDDING] = weights[VOCAB_EMBEDDING]
    if pos.is_last_stage:
        out[LN_F] = weights[LN_F]
        out[LM_HEAD] = split_vocab(weights[LM_HEAD], pos.tp_size, pos.tp_rank)
    for local, layer in enumerate(pp_layers(cfg.num_hidden_layers, pos.pp_size, pos.pp_rank)):
        src, dst = layer_prefix(layer), layer_prefix(local)
        for name, tensor in weights.items():
            if name.startswith(src):
                out[dst + name[len(src):]] = _shard_layer_tensor(name[len(src):], tensor, cfg, pos)
    return {k: v.contiguous() for k, v in out.items()}


def _shard_layer_tensor(suffix: str, tensor: torch.Tensor, cfg: TrtllmCheckpointConfig,
                        pos: RankPosition) -> torch.Tensor:
    if suffix not in _LAYER_SPLITS or _LAYER_SPLITS[suffix] is None:
        return tensor  # layer norms, per-tensor scales (checked by _check_tensors)
    if suffix == "attention.qkv.weight":
        return split_qkv(tensor, cfg, pos.tp_size, pos.tp_rank)
    return tensor.chunk(pos.tp_size, dim=_LAYER_SPLITS[suffix])[pos.tp_rank]


def split_qkv(qkv: torch.Tensor, cfg: TrtllmCheckpointConfig, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Rows [q heads | k heads | v heads] -> this rank's [local q | local k | local v] (each split by heads)."""
    q, k, v = qkv.split(cfg.qkv_split_sizes, dim=0)
    n_kv, head = cfg.num_key_value_heads, cfg.head_size
    if tp_size > n_kv:  # replicate each KV head so every rank gets one: (n_kv * head, ...) -> (tp * head, ...)
        k, v = (t.reshape(n_kv, head, *t.shape[1:]).repeat_interleave(tp_size // n_kv, dim=0)
                .reshape(tp_size * head, *t.shape[1:]) for t in (k, v))
    assert k.shape[0] == kv_heads_per_rank(n_kv, tp_size) * head * tp_size
    return torch.cat([t.chunk(tp_size, dim=0)[tp_rank] for t in (q, k, v)])


def split_vocab(lm_head: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """(vocab, hidden) -> this rank's (padded_vocab / tp, hidden); the padding rows are zeros."""
    vocab = lm_head.shape[0]
    pad = padded_vocab(vocab, tp_size) - vocab
    if pad:
        lm_head = torch.cat([lm_head, lm_head.new_zeros(pad, *lm_head.shape[1:])])
    return lm_head.chunk(tp_size, dim=0)[tp_rank]


def _check_tensors(weights: dict[str, torch.Tensor], cfg: TrtllmCheckpointConfig) -> None:
    """Every weight has its unsharded shape (packed quantized layouts do not), every other tensor is a scalar."""
    expected = cfg.expected_shapes()
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(f"the source checkpoint lacks tensors {missing[:5]}")
    for name, tensor in weights.items():
        if name in expected and tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, not {expected[name]}: packed quantized "
                             f"weights ({cfg.quantization.quant_algo}) cannot be sharded here; shard the "
                             "unquantized checkpoint and quantize each rank")
        if name not in expected and tensor.numel() != 1:
            raise ValueError(f"{name} {tuple(tensor.shape)} is not a per-tensor scale: only per-tensor "
                             f"quantization (FP8) can be sharded, not {cfg.quantization.quant_algo}")
