"""The quantization methods the build takes (spec files, the CLI), and the checkpoint algorithms they write."""
from __future__ import annotations

import enum


class QuantMethod(str, enum.Enum):
    """Weight quantization of the decoder linears (values are the names spec files use)."""

    NONE = "none"
    FP8 = "fp8"  # FP8 E4M3 weights and activations, per-tensor scales
    INT4_AWQ = "int4_awq"  # INT4 weights per group, activation-aware scales (W4A16_AWQ with pre_quant_scale)
    INT4_RTN = "int4_rtn"  # INT4 weights per group, round-to-nearest (AWQ's baseline; measurements only)
    INT8_WO = "int8_wo"  # INT8 weights per output channel, float activations

    @property
    def quant_algo(self) -> str | None:
        """TensorRT-LLM's quant_algo in the checkpoint's config.json."""
        return {QuantMethod.NONE: None, QuantMethod.FP8: "FP8", QuantMethod.INT4_AWQ: "W4A16_AWQ",
                QuantMethod.INT4_RTN: "W4A16_AWQ", QuantMethod.INT8_WO: "W8A16"}[self]

    @property
    def is_int4(self) -> bool:
        return self in (QuantMethod.INT4_AWQ, QuantMethod.INT4_RTN)

    @property
    def needs_calibration(self) -> bool:
        """FP8 needs activation scales, AWQ its scale search: both run calibration text through the model."""
        return self in (QuantMethod.FP8, QuantMethod.INT4_AWQ)


class KvCacheMethod(str, enum.Enum):
    NONE = "none"
    FP8 = "fp8"  # FP8 E4M3 K/V with one calibrated scale per layer

    @property
    def quant_algo(self) -> str | None:
        return None if self is KvCacheMethod.NONE else "FP8"


def parse_method(value: str, kind: type[enum.Enum], what: str) -> enum.Enum:
    """QuantMethod / KvCacheMethod from its name; ValueError listing the choices."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"unknown {what} {value!r}; choose one of {[m.value for m in kind]}") from None
