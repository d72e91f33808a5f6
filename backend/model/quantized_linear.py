"""Quantized linears, applied to a built CausalLM from the checkpoint's own quantization block (the model
code knows nothing of them): each decoder layer's attention.qkv / attention.dense / mlp.fc / mlp.gate / mlp.proj
(those the family has: a fused gate/up has no mlp.gate) becomes the module that executes its stored tensors (names
and shapes: build_engines/shard.py, LINEAR_TENSORS); a linear's bias (Qwen2's qkv) stays float and is kept.
lm_head and the embedding stay float (what ModelOpt exports by default too), as do modules matched by
`exclude_modules` (matched against the names in the rank's own file: under pipeline parallelism its layers are
numbered from 0). With an FP8 KV cache, each attention also holds its kv_cache_scaling_factor (1,), which the
runner's KV pools use (backend/model/quantized_kv.py).

Two steps, as the loaders need them: apply_quantization() swaps modules on the meta device (before
load_state_dict(assign=True)); prepare_quantized() converts the loaded tensors to the kernels' layout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backend.formats.checkpoint import QuantConfig, layer_prefix
from backend.formats.fp8 import FP8, fake_quantize_fp8
from backend.formats.int4 import dequantize, unpack
from backend.model.causal_lm import CausalLM

LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
# Group sizes torch's CPU INT4 kernel (_weight_int4pack_mm_for_cpu) takes; it also needs out_features % 16 == 0.
INT4_KERNEL_GROUPS = (32, 64, 128, 256)
# torch 2.13's CPU weight-only kernels (_weight_int4pack_mm_for_cpu, _weight_int8pack_mm) cost about linearly in
# the rows of x: measured on this 2-core AVX-512 EPYC (ms, float32, one thread; 4096 x 4096 weight), rows 1 / 4 / 16
# / 64: INT4 kernel 37 / 130 / 464 / 1975, INT8 kernel 21 / 60 / 269 / 1092, int8 values -> float weight + float
# matmul 86 / 86 / 112 / 120. So the kernels serve decode-sized inputs (<= KERNEL_MAX_ROWS rows) and larger ones
# (prefill chunks, evaluation) dequantize the int8-held values for that call and use the float GEMM.
KERNEL_MAX_ROWS = 4


class QuantizedLinear(nn.Module):
    """(..., in_features) -> (..., out_features) in the activations' dtype: matmul() of the subclass's format, plus
    the float bias when the linear has one."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        if bias:
            self._buffer("bias", (out_features,), dtype)
        else:
            self.bias = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.register_buffer(name, torch.empty(shape, dtype=dtype, device="meta"))

    def prepare(self) -> None:
        """After loading: build what forward() computes with."""

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class W8A16Linear(QuantizedLinear):
    """int8 weight (out, in) x per_channel_scale (out,): torch's CPU int8 weight-only kernel, or dequantized."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, quant: QuantConfig,
                 bias: bool = False) -> None:
        super().__init__(in_features, out_features, dtype, bias)
        self._buffer("weight", (out_features, in_features), torch.int8)
        self._buffer("per_channel_scale", (out_features,), dtype)
        self._kernel_scale: torch.Tensor | None = None

    def prepare(self) -> None:
        scale = self.per_channel_scale.to(self.dtype)
        self.per_channel_scale = scale
        # A fresh copy: torch's CPU int8 kernel segfaults (for more than one input row) on a weight that is not
        # 64-byte aligned, as tensors mapped from a safetensors file at an arbitrary offset are (torch 2.13).
        self.weight = self.weight.clone()
        probe = torch.zeros(1, self.in_features, dtype=self.dtype, device=self.weight.device)
        try:
            torch.ops.aten._weight_int8pack_mm(probe, self.weight, scale)
            self._kernel_scale = scale
        except (RuntimeError, NotImplementedError, AttributeError):  # no kernel for this device / dtype
            self._kernel_scale = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self._kernel_scale is None or flat.shape[0] > KERNEL_MAX_ROWS:
            return F.linear(x, self.weight.to(self.dtype) * self.per_channel_scale[:, None])
        return torch.ops.aten._weight_int8pack_mm(flat, self.weight, self._kernel_scale).view(*x.shape[:-1], -1)


class Int4Linear(QuantizedLinear):
    """W4A16 group-wise (RTN or AWQ): packed int8 weight (out, in / 2), group scales (out, in / group), and with
    AWQ the prequant_scaling_factor (in,) the activations are multiplied by first. torch's CPU INT4 kernel for
    decode-sized inputs where it applies (group in INT4_KERNEL_GROUPS, out % 16 == 0); otherwise the values (held
    unpacked as int8, 1 byte a weight) are dequantized for the call."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, quant: QuantConfig,
                 bias: bool = False) -> None:
        super().__init__(in_features, out_features, dtype, bias)
        if in_features % quant.group_size:
            raise ValueError(f"INT4 group_size {quant.group_size} does not divide this linear's in_features "
                             f"{in_features}")
        self.group_size = quant.group_size
        self._buffer("weight", (out_features, in_features // 2), torch.int8)
        self._buffer("weights_scaling_factor", (out_features, in_features // quant.group_size), dtype)
        self.prequant: bool = quant.pre_quant_scale
        if self.prequant:
            self._buffer("prequant_scaling_factor", (in_features,), dtype)
        self._packed: torch.Tensor | None = None  # the kernel's layout
        self._scales_zeros: torch.Tensor | None = None  # (in / group, out, 2): scale, zero (0: symmetric)
        self._values: torch.Tensor | None = None  # (out, in) int8 in [-8, 7]

    def uses_kernel(self) -> bool:
        return (self.weight.device.type == "cpu" and self.group_size in INT4_KERNEL_GROUPS
                and self.out_features % 16 == 0 and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))

    def prepare(self) -> None:
        self._values = unpack(self.weight)
        if self.uses_kernel():
            # The kernel reads unsigned nibbles with an implicit offset of 8: w = (u - 8) * scale + zero.
            self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(self._values.to(torch.int32) + 8, 1)
            scale_t = self.weights_scaling_factor.t().to(self.dtype)
            self._scales_zeros = torch.stack([scale_t, torch.zeros_like(scale_t)], dim=-1).contiguous()
        if self.prequant:
            self.prequant_scaling_factor = self.prequant_scaling_factor.to(self.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.prequant:
            x = x * self.prequant_scaling_factor
        flat = x.reshape(-1, self.in_features).contiguous()
        if self._packed is None or flat.shape[0] > KERNEL_MAX_ROWS:
            return F.linear(x, dequantize(self._values, self.weights_scaling_factor, self.group_size).to(self.dtype))
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self._packed, self.group_size, self._scales_zeros)
        return out.view(*x.shape[:-1], self.out_features)


class Fp8Linear(QuantizedLinear):
    """FP8 (W8A8): float8_e4m3fn weight (out, in) with a per-tensor weights_scaling_factor (1,), inputs quantized
    with the calibrated activation_scaling_factor (1,). No FP8 GEMM on CPU: the weight is dequantized once and
    the input goes through FP8 and back, so the numbers are those of an FP8 GEMM (up to accumulation order)."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, quant: QuantConfig,
                 bias: bool = False) -> None:
        super().__init__(in_features, out_features, dtype, bias)
        self._buffer("weight", (out_features, in_features), FP8)
        self._buffer("weights_scaling_factor", (1,), torch.float32)
        self._buffer("activation_scaling_factor", (1,), torch.float32)
        self._dequantized: torch.Tensor | None = None

    def prepare(self) -> None:
        self._dequantized = (self.weight.float() * self.weights_scaling_factor.float()).to(self.dtype).contiguous()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(fake_quantize_fp8(x, self.activation_scaling_factor), self._dequantized)


MODULES: dict[str, type[QuantizedLinear]] = {"W8A16": W8A16Linear, "W4A16_AWQ": Int4Linear, "FP8": Fp8Linear}


def apply_quantization(model: CausalLM, quant: QuantConfig, dtype: torch.dtype) -> CausalLM:
    """Swap the decoder layers' linears for `quant`'s modules (sized as the linears they replace: after TP
    sharding, the rank's share) and give each attention its KV scale when the KV cache is FP8."""
    if quant.kv_cache_quant_algo not in (None, "FP8"):
        raise ValueError(f"kv_cache_quant_algo {quant.kv_cache_quant_algo!r} is not supported by this runtime "
                         f"(supported: FP8)")
    cls = MODULES.get(quant.quant_algo) if quant.quant_algo else None
    if quant.quant_algo and cls is None:
        raise ValueError(f"quant_algo {quant.quant_algo!r} is not supported by this runtime ({sorted(MODULES)})")
    for i, layer in enumerate(model.transformer.layers):
        for name in linears_of(layer) if cls else ():
            if quant.excludes(layer_prefix(i) + name):
                continue
            parent, _, attr = name.rpartition(".")
            old = layer.get_submodule(name)
            setattr(layer.get_submodule(parent), attr,
                    cls(old.in_features, old.out_features, dtype, quant, bias=old.bias is not None))
        if quant.kv_cache_quant_algo == "FP8":
            layer.attention.register_buffer("kv_cache_scaling_factor",
                                            torch.empty(1, dtype=torch.float32, device="meta"))
    return model


def linears_of(layer: nn.Module) -> list[str]:
    """The names in LINEARS this decoder layer has (a fused gate/up MLP has no mlp.gate)."""
    return [name for name in LINEARS if _has(layer, name)]


def _has(module: nn.Module, name: str) -> bool:
    parent, _, attr = name.rpartition(".")
    return getattr(module.get_submodule(parent), attr, None) is not None


def prepare_quantized(model: CausalLM) -> CausalLM:
    """After load_state_dict: every quantized linear converts its tensors for its kernel (no-op for float models)."""
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.prepare()
    return model
