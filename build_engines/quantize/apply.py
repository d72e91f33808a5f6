"""Quantize a float TensorRT-LLM-layout checkpoint: the method names the build pipeline takes, the config.json
quantization block they mean, the tensors they write (names and shapes: build_engines/shard.py), and the
one-call quantize_checkpoint().

| method   | quant_algo | tensors per decoder linear (its float weight was (out, in))                              |
|----------|------------|------------------------------------------------------------------------------------------|
| fp8      | FP8        | weight float8_e4m3fn (out, in), weights_scaling_factor (1,), activation_scaling_factor (1,) |
| int4_awq | W4A16_AWQ  | weight int8 (out, in / 2) packed, weights_scaling_factor (out, in / group),              |
|          |            | prequant_scaling_factor (in,)                                                            |
| int4_rtn | W4A16_AWQ  | as int4_awq without prequant_scaling_factor (pre_quant_scale false: round-to-nearest)    |
| int8_wo  | W8A16      | weight int8 (out, in), per_channel_scale (out,)                                          |
kv_cache fp8 adds transformer.layers.N.attention.kv_cache_scaling_factor (1,). lm_head and the embedding stay
float (exclude_modules ["lm_head"], as ModelOpt's exports).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from backend.formats.checkpoint import CONFIG_FILE, QuantConfig, TrtllmCheckpointConfig, layer_prefix, rank_file
from backend.formats.fp8 import quantize_fp8, scale_for
from backend.formats.int4 import check_group, quantize_int4
from backend.formats.int8 import quantize_int8
from build_engines.cache import atomic_dir
from build_engines.convert import TORCH_DTYPES
from build_engines.quantize.awq import search_scale
from build_engines.quantize.calibration import ActivationStats, LinearInputStats, calibrate
from build_engines.quantize.methods import KvCacheMethod, QuantMethod, parse_method
from build_engines.side_files import copy_side_files

METHODS = tuple(m.value for m in QuantMethod)
KV_CACHE_METHODS = tuple(m.value for m in KvCacheMethod)
LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
# AWQ searches one scale per input: linears reading the same input share it (the runtime scales that input once).
SHARED_INPUT = (("attention.qkv",), ("attention.dense",), ("mlp.fc", "mlp.gate"), ("mlp.proj",))
DEFAULT_CALIB_TOKENS = 8192

__all__ = ["METHODS", "KV_CACHE_METHODS", "ActivationStats", "calibrate", "quant_config", "quantize_weights",
           "quantize_checkpoint", "needs_calibration"]


def quant_config(method: str, kv_cache: str = "none", group_size: int = 128) -> QuantConfig:
    """The config.json quantization block of a method (QuantMethod) and KV cache method (KvCacheMethod)."""
    method = parse_method(method, QuantMethod, "quantization method")
    kv = parse_method(kv_cache, KvCacheMethod, "KV cache quantization")
    if method.is_int4 and (group_size < 2 or group_size % 2):
        raise ValueError(f"INT4 group_size must be an even number >= 2, got {group_size}")
    return QuantConfig(quant_algo=method.quant_algo, kv_cache_quant_algo=kv.quant_algo,
                       group_size=group_size if method.is_int4 else 128,
                       has_zero_point=False, pre_quant_scale=method is QuantMethod.INT4_AWQ,
                       exclude_modules=("lm_head",) if method is not QuantMethod.NONE else None)


def method_of(quant: QuantConfig) -> QuantMethod:
    """Inverse of quant_config for the weights: which method a quantization block means."""
    if quant.quant_algo == "W4A16_AWQ":
        return QuantMethod.INT4_AWQ if quant.pre_quant_scale else QuantMethod.INT4_RTN
    return next(m for m in QuantMethod if m.quant_algo == quant.quant_algo and m is not QuantMethod.INT4_RTN)


def needs_calibration(quant: QuantConfig) -> bool:
    """FP8 (activation scales), AWQ (scale search) and an FP8 KV cache need activation statistics."""
    return method_of(quant).needs_calibration or quant.kv_cache_quant_algo == "FP8"


def quantize_weights(weights: dict[str, torch.Tensor], num_layers: int, quant: QuantConfig,
                     stats: ActivationStats | None, dtype: torch.dtype,
                     progress: bool = False) -> dict[str, torch.Tensor]:
    """Float checkpoint tensors (unsharded, TRT-LLM names) -> the quantized checkpoint's tensors. Tensors that
    stay float are cast to `dtype`; so are INT4 / INT8 scales (FP8 and KV scales stay float32, as TRT-LLM's)."""
    if needs_calibration(quant) and stats is None:
        raise ValueError(f"{method_of(quant)} weights / kv_cache {quant.kv_cache_quant_algo} need activation "
                         f"statistics: run calibrate() on the float checkpoint first")
    out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    method = method_of(quant)
    for i in tqdm(range(num_layers), desc=f"quantizing ({method})", unit="layer", disable=not progress):
        if method is not QuantMethod.NONE:
            for group in SHARED_INPUT:
                # (a fused gate/up checkpoint has no mlp.gate)
                names = [layer_prefix(i) + n for n in group if not quant.excludes(layer_prefix(i) + n)
                         and f"{layer_prefix(i)}{n}.weight" in weights]
                if names:
                    out.update(_quantize_group(weights, names, method, quant, stats, dtype))
        if quant.kv_cache_quant_algo == "FP8":
            out[f"{layer_prefix(i)}attention.kv_cache_scaling_factor"] = scale_for(max(stats.kv_amax[i]))
    return out


def _quantize_group(weights: dict[str, torch.Tensor], names: list[str], method: QuantMethod, quant: QuantConfig,
                    stats: ActivationStats | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of linears that read one input (names without ".weight")."""
    for name in names:
        if f"{name}.weight" not in weights:
            raise ValueError(f"the checkpoint lacks {name}.weight")
    out: dict[str, torch.Tensor] = {}
    if method is QuantMethod.INT8_WO:
        for name in names:
            q, scale = quantize_int8(weights[f"{name}.weight"])
            out.update({f"{name}.weight": q, f"{name}.per_channel_scale": scale.to(dtype)})
    elif method is QuantMethod.FP8:
        act_scale = scale_for(_input_stats(stats, names[0]).amax)
        for name in names:
            q, scale = quantize_fp8(weights[f"{name}.weight"])
            out.update({f"{name}.weight": q, f"{name}.weights_scaling_factor": scale,
                        f"{name}.activation_scaling_factor": act_scale.clone()})
    else:
        for name in names:
            check_group(weights[f"{name}.weight"].shape[1], quant.group_size, f"{name}.weight")
        scales = _awq_scales(weights, names, quant.group_size, stats) if method is QuantMethod.INT4_AWQ else None
        for name in names:
            w = weights[f"{name}.weight"].float()
            q = quantize_int4(w if scales is None else w * scales, quant.group_size)
            out.update({f"{name}.weight": q.packed, f"{name}.weights_scaling_factor": q.scales.to(dtype)})
            if scales is not None:
                out[f"{name}.prequant_scaling_factor"] = (1.0 / scales).to(dtype)
    return out


def _input_stats(stats: ActivationStats, name: str) -> LinearInputStats:
    if name not in stats.linears:
        raise ValueError(f"the activation statistics have nothing for {name} (calibrated on another model?)")
    return stats.linears[name]


def _awq_scales(weights: dict[str, torch.Tensor], names: list[str], group_size: int,
                stats: ActivationStats) -> torch.Tensor:
    """One (in,) scale for linears sharing an input: searched on their weights stacked by output rows."""
    st = _input_stats(stats, names[0])
    stacked = torch.cat([weights[f"{n}.weight"].float() for n in names])
    return search_scale(stacked, st.samples, st.channel_mean_abs, group_size).scales


def quantize_checkpoint(src_ckpt_dir: Path, out_dir: Path, method: str, kv_cache: str = "none",
                        group_size: int = 128, calib_text: Path | None = None, tokenizer_dir: Path | None = None,
                        max_calib_tokens: int = DEFAULT_CALIB_TOKENS, progress: bool = True,
                        stats: ActivationStats | None = None) -> Path:
    """Write out_dir/config.json (with the quantization block) and out_dir/rank0.safetensors, atomically; return
    out_dir. src_ckpt_dir is an unsharded float checkpoint (shard the result with build_engines/shard.py).
    Calibration (fp8, int4_awq, kv_cache fp8) tokenizes with tokenizer_dir (default: src_ckpt_dir); `stats`
    from an earlier calibrate() of the same checkpoint skips it (several methods, one calibration)."""
    src_ckpt_dir, out_dir = Path(src_ckpt_dir), Path(out_dir)
    quant = quant_config(method, kv_cache, group_size)
    raw = json.loads((src_ckpt_dir / CONFIG_FILE).read_text())
    cfg = TrtllmCheckpointConfig.from_dict(raw)
    if cfg.mapping.world_size != 1:
        raise ValueError(f"{src_ckpt_dir} is sharded ({cfg.mapping}); quantize the unsharded checkpoint, then shard")
    if cfg.quantization.quantized:
        raise ValueError(f"{src_ckpt_dir} is already quantized ({cfg.quantization}); start from a float one")
    if needs_calibration(quant) and stats is None:
        tok = Path(tokenizer_dir) if tokenizer_dir else src_ckpt_dir
        if not any((tok / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise ValueError(f"no tokenizer in {tok}: pass tokenizer_dir (the HF model directory) for calibration")
        stats = calibrate(src_ckpt_dir, tok, calib_text, max_calib_tokens, progress=progress)
    weights = quantize_weights(load_file(str(src_ckpt_dir / rank_file(0))), cfg.num_hidden_layers, quant, stats,
                               TORCH_DTYPES[cfg.dtype], progress=progress)
    raw["quantization"] = dataclasses.asdict(quant)  # (exclude_modules, a tuple, is written as a JSON list)
    with atomic_dir(out_dir) as tmp:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / rank_file(0)), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")
        copy_side_files(src_ckpt_dir, tmp)
    return out_dir
