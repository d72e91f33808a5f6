"""The memory plan, printed before anything is built: weights per rank, KV bytes per token per rank, and the KV
tokens that fit in the spec's device memory and fraction. An impossible spec is refused here with what to change.

Per-rank shapes come from the sharder itself (shard.shard_weights over meta tensors), so the plan splits the
model exactly as the build will; the KV capacity comes from the engine's own planner (backend/engine/memory_plan.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from backend.engine.memory_plan import KVPlan, plan_kv_cache, sequence_kv_tokens
from backend.formats.checkpoint import LM_HEAD, LN_F, VOCAB_EMBEDDING, Mapping, QuantConfig, TrtllmCheckpointConfig
from backend.formats.checkpoint_tensors import expected_shapes
from backend.formats.rank_layout import RankPosition, check_tp, kv_heads_per_rank, pp_layers
from backend.model.config import position_limit
from build_engines.shard import COLUMN_PARALLEL, ROW_PARALLEL, shard_weights
from build_engines.spec import BuildSpec, SpecError

_FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_LINEAR_NAMES = {n.rsplit(".", 1)[-1] for n in COLUMN_PARALLEL + ROW_PARALLEL}  # qkv, dense, fc, gate, proj


@dataclass(frozen=True)
class RankPlan:
    rank: int
    layers: int  # decoder layers on this rank's pipeline stage
    weight_bytes: int
    kv_bytes_per_token: int
    kv: KVPlan


@dataclass(frozen=True)
class MemoryPlan:
    ranks: list[RankPlan]
    device_bytes: int
    fraction: float
    sequence_tokens: int  # KV tokens one max_seq_len sequence holds at once (fewer with a sliding window everywhere)

    @property
    def kv_tokens(self) -> int:
        """Tokens the whole engine can cache: every rank holds the same slots, so the tightest rank decides."""
        return min(r.kv.tokens for r in self.ranks)

    def table(self) -> str:
        rows = ["| rank | layers | weights | KV bytes / token | KV tokens that fit |", "|---|---|---|---|---|"]
        rows += [f"| {r.rank} | {r.layers} | {_mib(r.weight_bytes)} | {r.kv_bytes_per_token} | {r.kv.tokens} "
                 f"({r.kv.reason}) |" for r in self.ranks]
        return "\n".join(rows)

    def describe(self) -> str:
        return (f"memory plan: {self.device_bytes / 2**30:.1f} GiB per device, KV cache fraction {self.fraction} "
                f"of what the weights leave\n{self.table()}\nKV capacity of the engine: {self.kv_tokens} tokens")

    def to_dict(self) -> dict:
        return {"device_bytes": self.device_bytes, "fraction": self.fraction, "kv_tokens": self.kv_tokens,
                "sequence_tokens": self.sequence_tokens,
                "ranks": [{"rank": r.rank, "layers": r.layers, "weight_bytes": r.weight_bytes,
                           "kv_bytes_per_token": r.kv_bytes_per_token, "kv_tokens": r.kv.tokens,
                           "kv_reason": r.kv.reason} for r in self.ranks]}


def plan_memory(cfg: TrtllmCheckpointConfig, spec: BuildSpec) -> MemoryPlan:
    """The plan for building `cfg` (the unsharded, unquantized model) as `spec` says. Raises SpecError with what
    to change when tp/pp cannot split the model or a rank's weights and one full sequence do not fit."""
    _check_split(cfg, spec)
    quantized = dataclasses.replace(cfg, quantization=QuantConfig(
        quant_algo=spec.quant_algo, kv_cache_quant_algo=spec.kv_cache_quant_algo, group_size=spec.group_size))
    weights = meta_weights(quantized)
    engine = spec.limits.engine_config(spec.memory.kv_cache_free_mem_fraction)
    ranks = []
    for rank in range(spec.world_size):
        pos = RankPosition(rank, spec.tp_size, spec.pp_size)
        shard = shard_weights(weights, quantized, pos)
        weight_bytes = sum(t.numel() * t.element_size() for t in shard.values())
        rank_cfg = _rank_view(quantized, pos)
        free = spec.memory.device_bytes - weight_bytes
        if free <= 0:
            raise SpecError(f"rank {rank}'s weights take {_mib(weight_bytes)}, more than the device's "
                            f"{spec.memory.device_memory_gib} GiB: raise tp_size or pp_size, or quantize "
                            f"(int4_awq stores 4 bits a weight)")
        try:
            kv = plan_kv_cache(rank_cfg, engine, free)
        except ValueError as exc:
            raise SpecError(f"rank {rank} (weights {_mib(weight_bytes)}): {exc}; or raise tp_size / pp_size, or "
                            f"quantize the weights or the KV cache (kv_cache: fp8)") from None
        ranks.append(RankPlan(rank, len(pos.layers(cfg.num_hidden_layers)), weight_bytes,
                              kv.bytes_per_token, kv))
    return MemoryPlan(ranks, spec.memory.device_bytes, spec.memory.kv_cache_free_mem_fraction,
                      sequence_kv_tokens(cfg, engine))


def _check_split(cfg: TrtllmCheckpointConfig, spec: BuildSpec) -> None:
    try:
        check_tp(cfg.num_attention_heads, cfg.num_key_value_heads, spec.tp_size)
    except ValueError as exc:
        raise SpecError(f"tp_size: {exc}") from None
    if spec.pp_size > cfg.num_hidden_layers:
        raise SpecError(f"pp_size {spec.pp_size} exceeds the model's {cfg.num_hidden_layers} layers: every pipeline "
                        f"stage needs one; set pp_size <= {cfg.num_hidden_layers}")
    if spec.quant_algo == "W4A16_AWQ":
        attn_width = cfg.num_attention_heads * cfg.head_size  # attention.dense's input (!= hidden for Gemma 2)
        for name, width in (("hidden_size", cfg.hidden_size), ("intermediate_size", cfg.intermediate_size),
                            ("num_attention_heads x head_size", attn_width)):
            if width % (spec.group_size * spec.tp_size):
                raise SpecError(f"int4_awq: {name} {width} does not split into groups of {spec.group_size} on each of "
                                f"{spec.tp_size} tensor-parallel ranks; lower group_size or tp_size")
    limit = position_limit(cfg)
    if limit is not None and spec.limits.max_seq_len > limit:
        raise SpecError(f"limits.max_seq_len ({spec.limits.max_seq_len}) exceeds the model's max_position_embeddings "
                        f"({limit}): lower it")


def meta_weights(cfg: TrtllmCheckpointConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the unsharded checkpoint the build writes, on the meta device (shapes and dtypes only).

    Decoder linears take the quantized storage: FP8 / INT8 a byte a weight, INT4 two a byte (out, in / 2) with
    (out, in / group) scales; embeddings, norms and lm_head stay in cfg.dtype (TRT-LLM excludes lm_head too)."""
    dtype = getattr(torch, cfg.dtype)
    algo = cfg.quantization.quant_algo
    out = {}
    for name, shape in expected_shapes(cfg).items():
        linear = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if algo is None or name in (VOCAB_EMBEDDING, LN_F, LM_HEAD) or linear not in _LINEAR_NAMES:
            out[name] = torch.empty(shape, dtype=dtype, device="meta")
            continue
        prefix = name[: -len("weight")]
        if algo == "W4A16_AWQ":
            out[name] = torch.empty(shape[0], shape[1] // 2, dtype=torch.int8, device="meta")
            out[prefix + "weights_scaling_factor"] = torch.empty(
                shape[0], shape[1] // cfg.quantization.group_size, dtype=dtype, device="meta")
            out[prefix + "prequant_scaling_factor"] = torch.empty(shape[1], dtype=dtype, device="meta")
        else:  # FP8 (per-tensor scales) or W8A16 (per-channel scales)
            out[name] = torch.empty(shape, dtype=torch.int8, device="meta")
            scale = (shape[0],) if algo == "W8A16" else (1,)
            out[prefix + ("per_channel_scale" if algo == "W8A16" else "weights_scaling_factor")] = torch.empty(
                scale, dtype=torch.float32, device="meta")
    return out


def _rank_view(cfg: TrtllmCheckpointConfig, pos: RankPosition) -> TrtllmCheckpointConfig:
    """The model as one rank sees it, for KV sizing: its stage's layers (and their windows) and its share of the
    (KV) heads."""
    tp, layers = pos.tp_size, pp_layers(cfg.num_hidden_layers, pos.pp_size, pos.pp_rank)
    types = None if cfg.layer_types is None else tuple(cfg.layer_types[i] for i in layers)
    return dataclasses.replace(
        cfg, num_hidden_layers=len(layers), layer_types=types,
        sliding_window=cfg.sliding_window if types and "sliding_attention" in types else None,
        num_attention_heads=cfg.num_attention_heads // tp,
        num_key_value_heads=kv_heads_per_rank(cfg.num_key_value_heads, tp), mapping=Mapping())


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
