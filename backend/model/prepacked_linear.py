"""Float linears on oneDNN with weights reordered once into its blocked layout (what vLLM-CPU and inductor's CPU
freezing do), instead of MKL GEMMs on the plain row-major weights every step.

A kernel choice, not a format: the same float32 weights, the same products (results differ from MKL's by float
summation order only). Measured on the 2-core AMD EPYC (AVX2 + FMA) with torch 2.13, one thread, the four linears
of a 768-wide layer plus an 8192-row lm_head: batch 16 rows 18.6 ms with MKL, 11.7 ms with oneDNN; batch 1 3.97 ->
3.56 ms (perf/ISSUE16.md). Applied after loading, to plain nn.Linear modules only (quantized linears keep
their own kernels); the replaced modules keep no plain copy of the weight.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator

import torch
from torch import nn

from backend.kernel_choices import LINEAR_DTYPES, LINEAR_KERNELS
from backend.model.kernels.gemv import MAX_ROWS as GEMV_MAX_ROWS
from backend.model.kernels.gemv import copy_bytes, gemv_copy
from backend.model.kernels.gemv import gemv as gemv_product

log = logging.getLogger(__name__)


def ideep_cache_unusable() -> str | None:
    """Why the environment's LRU_CACHE_CAPACITY would crash torch's oneDNN linears (None: it would not).

    ideep (torch's oneDNN layer) keeps its primitives in an LRU cache sized by LRU_CACHE_CAPACITY, read with C's
    atoi: a value that reads as 0 ("0", "abc") makes the first oneDNN linear segfault (torch 2.13, measured:
    exit 139; "-1" and "1" run). perf/SOAK.md: that cache and oneDNN's own hold the engine's per-row-count memory."""
    value = os.environ.get("LRU_CACHE_CAPACITY")
    if value is None:
        return None
    digits = re.match(r"\s*[+-]?\d+", value)  # what atoi reads
    if digits is not None and int(digits.group()) != 0:
        return None
    return (f"LRU_CACHE_CAPACITY={value!r} in the environment crashes torch's oneDNN linears (ideep reads it as "
            f"a cache of 0 primitives); unset it or set it to a positive number")


def onednn_unavailable(device: torch.device | str, dtype: torch.dtype | None = None) -> str | None:
    """Why oneDNN prepacked linears cannot run here (None: they can)."""
    if torch.device(device).type != "cpu":
        return f"oneDNN prepacked linears run on CPU only, not on {device}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return f"this torch build ({torch.__version__}) has no oneDNN (mkldnn) linear kernels"
    if (unusable := ideep_cache_unusable()) is not None:
        return unusable
    if dtype is not None and dtype != torch.float32:
        if dtype != torch.bfloat16 or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return (f"oneDNN prepacked linears are used for float32 here (and bfloat16 on CPUs with native bf16), "
                    f"not {dtype}")
    return None


def bf16_linears_unavailable(device: torch.device | str) -> str | None:
    """Why bfloat16 linears beside float32 activations cannot run here (None: they can)."""
    if (reason := onednn_unavailable(device)) is not None:
        return reason
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no native bf16 arithmetic (AVX-512 BF16 or AMX), where bf16 linears are slower than float32"
    return None


def resolve_linear_dtype(choice: str, device: torch.device | str, checkpoint_dtype: torch.dtype,
                         not_plain: str | None = None) -> torch.dtype | None:
    """The dtype the linears compute in beside float32 activations (torch.bfloat16, or torch.float32: the whole
    model widened), or None: everything in the checkpoint's dtype. `not_plain`: why the checkpoint's linears are not
    plain float ones in this process (quantized, sharded), None where they are. An explicit choice that cannot run
    raises ValueError naming why.

    Why bf16: on a CPU with native bf16 (AVX-512 BF16), oneDNN's bf16 linears take ~0.55x the time of its float32
    ones at 1-512 rows (half the weight bytes, twice the FMA width; perf/ISSUE16.md), while bf16 norms, rotary and
    residual adds are slower than float32 ones there. For a bfloat16 checkpoint the weights are exact either way;
    inputs are rounded to bf16 before each linear and its output after it, as in the checkpoint's own dtype.
    Why float32: on a CPU without native bf16 (AVX2 + FMA), every bf16 or fp16 operator widens and rounds in
    software, and float32 is the fast dtype (the 125M model's batch-16 decode step ~4x faster, perf/ISSUE16.md);
    the widened weights are the checkpoint's exact values."""
    if choice not in LINEAR_DTYPES:
        raise ValueError(f"linear_dtype must be one of {LINEAR_DTYPES}, got {choice!r}")
    if choice == "checkpoint":
        return None
    if choice == "float32":
        if not_plain is not None:
            raise ValueError(f"linear_dtype 'float32' is unavailable: {not_plain}")
        return None if checkpoint_dtype == torch.float32 else torch.float32
    reason = bf16_linears_unavailable(device) or not_plain
    if choice == "bfloat16":
        if reason is not None:
            raise ValueError(f"linear_dtype 'bfloat16' is unavailable: {reason}")
        return torch.bfloat16
    if reason is None and checkpoint_dtype == torch.bfloat16:
        return torch.bfloat16
    software_bf16 = torch.device(device).type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if software_bf16 and not_plain is None and checkpoint_dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return None


def resolve_linear_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """"auto" -> "onednn" where it can run, else "torch"; an explicit "onednn" that cannot run raises ValueError."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"linear_kernel must be one of {LINEAR_KERNELS}, got {kernel!r}")
    reason = onednn_unavailable(device, dtype)
    if kernel == "onednn" and reason is not None:
        raise ValueError(f"linear_kernel 'onednn' is unavailable: {reason}")
    if kernel == "auto":
        if reason is not None and reason == ideep_cache_unusable():
            log.warning("linear_kernel 'auto' uses torch's linears (MKL), not oneDNN's: %s", reason)
        # bf16 on CPUs without native bf16 arithmetic is slow with any kernel; float32 is the fast dtype there.
        return "torch" if reason is not None or dtype != torch.float32 else "onednn"
    return kernel


class PrepackedLinear(nn.Module):
    """y = x W^T (+ b) with W held in oneDNN's layout (an opaque mkldnn tensor, not a parameter), in `dtype` (None:
    the weight's): x is rounded to it before the product and y widened back to x's dtype after it (bf16 linears
    beside float32 activations; decode_layers.cpp's packed_linear does the same). With `gemv` (float32 or bf16
    linears), a second copy of W for the GEMV (kernels/gemv.py: bf16 interleaved, float32 as it is or in bf16 where
    that is exact) computes products of 1 to GEMV_MAX_ROWS float32 rows: the same result up to float32 summation
    order."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None = None,
                 gemv: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype or weight.dtype
        if gemv and self.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"the GEMV serves bfloat16 and float32 linears, not {self.dtype} ones")
        weight = weight.detach().to(self.dtype).contiguous()
        self.weight_bytes = weight.numel() * weight.element_size()
        # batch_size is a layout hint; the packed weight serves any number of rows (decode and prefill alike).
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
        self.bias = None if bias is None else bias.detach().to(self.dtype).clone()
        self.gemv = gemv_copy(weight, self.dtype) if gemv else None  # the GEMV kernel's layout (kernels/gemv.py)

    @classmethod
    def of(cls, linear: nn.Linear, dtype: torch.dtype | None = None) -> PrepackedLinear:
        return cls(linear.weight, linear.bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._on_gemv(x):
            return gemv_product(x, self.gemv, self.bias, self.dtype)
        if x.dtype == self.dtype:
            return self._onednn(x)
        return self._onednn(x.to(self.dtype)).to(x.dtype)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        """x in self.dtype -> x W^T (+ b) in self.dtype, on the packed weight."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def _on_gemv(self, x: torch.Tensor) -> bool:
        return self.gemv is not None and x.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_ROWS and x.dtype == torch.float32

    def forward_unwidened(self, x: torch.Tensor) -> torch.Tensor | None:
        """forward(x) before its widening back to x's dtype: the oneDNN product in self.dtype, so that
        forward(x) == forward_unwidened(x).to(x.dtype) bit for bit. None where forward computes otherwise (x already
        in self.dtype, or rows the GEMV takes): the caller runs forward."""
        if x.dtype == self.dtype or self._on_gemv(x):
            return None
        return self._onednn(x.to(self.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"gemv={self.gemv is not None}")


def _prepackable(model: nn.Module) -> Iterator[tuple[nn.Module, str, torch.Tensor, torch.Tensor | None]]:
    """(parent, attribute, weight, bias) of every plain float nn.Linear under `model` and each MLP's fused fc/gate
    weight (which replaces its fc and gate linears)."""
    for parent in list(model.modules()):
        fused = getattr(parent, "fc_gate", None)
        unused = ("fc", "gate") if isinstance(fused, torch.Tensor) else ()
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.is_floating_point() and name not in unused:
                yield parent, name, child.weight, child.bias
        if unused:
            yield parent, "fc_gate", fused, None


def prepack_linears(model: nn.Module, dtype: torch.dtype | None = None, gemv: bool = False) -> nn.Module:
    """Swap every plain float nn.Linear under `model` (and each MLP's fused fc/gate weight) for a PrepackedLinear
    computing in `dtype` (None: the weights'), each with the GEMV's copy where `gemv`."""
    with torch.inference_mode():
        for parent, name, weight, bias in list(_prepackable(model)):
            setattr(parent, name, PrepackedLinear(weight, bias, dtype, gemv))
    return model


def gemv_copy_bytes(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of the GEMV's copies prepack_linears(model, dtype, gemv=True) would add beside oneDNN's packed weights
    (bf16: interleaved, columns padded to pairs; float32: the weights as they are, 2 bytes each where bf16 holds them
    exactly)."""
    return sum(copy_bytes(w, dtype or w.dtype) for _, _, w, _ in _prepackable(model))
