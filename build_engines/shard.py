"""Split a single-rank TensorRT-LLM checkpoint into tp_size x pp_size rank files, by TensorRT-LLM 1.2.x's rules.

Per rank (tp_rank t of tp_size, stage p of pp_size; rank = p * tp_size + t, see rank_layout.py):
- layers: the stage's range (rank_layout.pp_layers), renamed from 0 in each file, as TRT-LLM's converters do;
- attention.qkv and its bias (column-parallel): q, k and v each split by heads; when tp > kv heads, each KV head
  is first repeated tp / kv_heads times, so every rank holds one (replicated) KV head;
- mlp.fc, mlp.gate (column-parallel): split by output rows, a fused [up | gate] fc (swiglu) half by half;
  attention.dense, mlp.proj (row-parallel): split by input columns; their partial outputs are summed (all_reduce)
  at run time;
- vocab_embedding: on the first stage, whole, or with use_parallel_embedding (TRT-LLM sets it for Gemma under TP)
  padded and split by vocabulary like lm_head; ln_f and lm_head on the last stage, lm_head rows padded with zeros
  to a multiple of tp and split by vocabulary;
- layer norms (q/k norms too) and per-tensor (scalar) quantization scales (FP8 weights, activations, KV cache):
  replicated;
- quantized linears' other tensors follow their weight: W8A16 per_channel_scale (out,) and INT4 group scales
  (out, in / group) by output rows in column-parallel linears; in row-parallel ones the group scales and AWQ's
  prequant_scaling_factor (in,) by input, per_channel_scale replicated. A split that would cut an INT4 group
  is refused, naming the tensor.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from backend.formats.checkpoint import (
    CONFIG_FILE,
    LM_HEAD,
    LN_F,
    VOCAB_EMBEDDING,
    TrtllmCheckpointConfig,
    layer_prefix,
    rank_file,
)
from backend.formats.checkpoint_tensors import expected_shapes, fused_gate_up, qkv_split_sizes
from backend.formats.rank_layout import RankPosition, check_tp, kv_heads_per_rank, padded_vocab, pp_layers
from build_engines.cache import atomic_dir
from build_engines.side_files import copy_side_files

# Linears of a decoder layer by how they split (TRT-LLM's ColumnLinear / RowLinear).
COLUMN_PARALLEL = ("attention.qkv", "mlp.fc", "mlp.gate")
ROW_PARALLEL = ("attention.dense", "mlp.proj")
# Tensors a linear may carry (TRT-LLM names): weight (out, in), or INT4 packed (out, in / 2); per_channel_scale
# (out,) of W8A16; weights_scaling_factor (1,) of FP8 or (out, in / group) of INT4; prequant_scaling_factor (in,)
# of AWQ; activation_scaling_factor (1,) of FP8.
LINEAR_TENSORS = ("weight", "bias", "per_channel_scale", "weights_scaling_factor", "prequant_scaling_factor",
                  "activation_scaling_factor")


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
        for rank in tqdm(range(tp_size * pp_size), desc="shard", unit="rank"):
            shard = shard_weights(weights, cfg, RankPosition(rank, tp_size, pp_size))
            save_file(shard, str(tmp / rank_file(rank)), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(sharded_config(raw, tp_size, pp_size), indent=2) + "\n")
        copy_side_files(src_dir, tmp)
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
    # TRT-LLM's GemmaConfig forces use_parallel_embedding = (tp > 1) whatever it is given (share_embedding_table).
    out["use_parallel_embedding"] = bool(out.get("share_embedding_table")) and tp_size > 1
    return out


def shard_weights(weights: dict[str, torch.Tensor], cfg: TrtllmCheckpointConfig,
                  pos: RankPosition) -> dict[str, torch.Tensor]:
    """The tensors of one rank, named as that rank's file names them."""
    out: dict[str, torch.Tensor] = {}
    if pos.is_first_stage:
        parallel = cfg.share_embedding_table and pos.tp_size > 1  # as sharded_config writes use_parallel_embedding
        out[VOCAB_EMBEDDING] = (split_vocab(weights[VOCAB_EMBEDDING], pos.tp_size, pos.tp_rank) if parallel
                                else weights[VOCAB_EMBEDDING])
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
    linear, _, kind = suffix.rpartition(".")  # "mlp.proj", "weight"
    if tensor.numel() == 1 or linear not in COLUMN_PARALLEL + ROW_PARALLEL:
        return tensor  # layer norms, per-tensor scales (FP8 weight / activation / KV cache): replicated
    tp, rank = pos.tp_size, pos.tp_rank
    if linear in COLUMN_PARALLEL:
        if kind == "prequant_scaling_factor":
            return tensor  # (in,): the input of a column-parallel linear is whole on every rank
        if linear == "attention.qkv":
            return split_qkv(tensor, cfg, tp, rank)
        if linear == "mlp.fc" and fused_gate_up(cfg):  # [up | gate]: each half by output rows
            return torch.cat([_chunk(half, 0, tp, rank, suffix) for half in tensor.chunk(2, dim=0)])
        return _chunk(tensor, 0, tp, rank, suffix)  # by output rows: weight, bias, channel and group scales alike
    if kind == "per_channel_scale":
        return tensor  # (out,): a row-parallel output is whole (summed) on every rank
    # By input columns: weight (packed or not), INT4 group scales (out, in / group), prequant scales (in,).
    return _chunk(tensor, 0 if kind == "prequant_scaling_factor" else 1, tp, rank, suffix)


def _chunk(tensor: torch.Tensor, dim: int, tp: int, rank: int, name: str) -> torch.Tensor:
    if tensor.shape[dim] % tp:
        hint = " (INT4 groups of a row-parallel linear must split evenly: lower tp)" if name.endswith(
            "weights_scaling_factor") else ""
        raise ValueError(f"{name} {tuple(tensor.shape)}: dimension {dim} does not split into {tp} equal parts{hint}")
    return tensor.chunk(tp, dim=dim)[rank]


def split_qkv(qkv: torch.Tensor, cfg: TrtllmCheckpointConfig, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Rows [q heads | k heads | v heads] -> this rank's [local q | local k | local v] (each split by heads); the
    weight, its bias and quantization tensors by output rows alike."""
    q, k, v = qkv.split(qkv_split_sizes(cfg), dim=0)
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
    """Every tensor is one this sharder knows how to split; float (and FP8, INT8) weights have their unsharded
    shape, INT4 ones their packed shape (out, in / 2)."""
    expected = expected_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(f"the source checkpoint lacks tensors {missing[:5]}")
    int4 = cfg.quantization.quant_algo == "W4A16_AWQ"
    for name, tensor in weights.items():
        want = expected.get(name)
        if want is not None and int4 and len(want) == 2 and name.rsplit(".", 2)[-2] in _LINEAR_NAMES:
            want = (want[0], want[1] // 2)  # two INT4 values a byte
        if want is not None and tuple(tensor.shape) != want:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, not {want} ({cfg.quantization.quant_algo})")
        kind = name.rsplit(".", 1)[-1]
        if want is None and tensor.numel() != 1 and kind not in LINEAR_TENSORS:
            raise ValueError(f"{name} {tuple(tensor.shape)}: a tensor this sharder does not know how to split")


_LINEAR_NAMES = {n.rsplit(".", 1)[-1] for n in COLUMN_PARALLEL + ROW_PARALLEL}  # qkv, dense, fc, gate, proj
