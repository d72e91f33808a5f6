"""One generation request, validated, and its two wire forms: ensemble input tensors and a
generate-endpoint JSON body. Field names are the ensemble's input names (see CONTRACT.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1

Check = Callable[[str, Any], None]  # (field name, value) -> None, or raises ValueError


def _int_in(lo: int, hi: int) -> Check:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")

    return check


def _float_in(lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False) -> Check:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        if value < lo or value > hi or (lo_open and value == lo):
            low = f"({lo}" if lo_open else f"[{lo}"
            raise ValueError(f"{name} must be in {low}, {hi}], got {value}")

    return check


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _words(name: str, value: Any) -> None:
    if not isinstance(value, list):  # a bare str would be sent as one word per character
        raise ValueError(f"{name} must be a list of strings, got {type(value).__name__}")
    if not all(isinstance(word, str) and word for word in value):
        raise ValueError(f"{name} must hold non-empty strings, got {value!r}")


@dataclass(frozen=True)
class _Option:
    datatype: str  # the ensemble input's Triton dtype
    check: Check


# The optional ensemble inputs a request may set, by name; None (or an empty word list) = not sent.
OPTIONS: dict[str, _Option] = {
    "temperature": _Option("FP32", _float_in(0.0)),
    "top_k": _Option("INT32", _int_in(0, INT32_MAX)),  # 0 = no top-k filter
    "top_p": _Option("FP32", _float_in(0.0, 1.0)),  # 0 = no top-p filter (TensorRT-LLM's meaning)
    "seed": _Option("UINT64", _int_in(0, UINT64_MAX)),
    "end_id": _Option("INT32", _int_in(0, INT32_MAX)),
    "pad_id": _Option("INT32", _int_in(0, INT32_MAX)),
    "min_tokens": _Option("INT32", _int_in(0, INT32_MAX)),
    "repetition_penalty": _Option("FP32", _float_in(0.0, lo_open=True)),
    "presence_penalty": _Option("FP32", _float_in()),
    "frequency_penalty": _Option("FP32", _float_in()),
    "length_penalty": _Option("FP32", _float_in()),
    "stop_words": _Option("BYTES", _words),
    "bad_words": _Option("BYTES", _words),
    "exclude_input_in_output": _Option("BOOL", _flag),
    "return_log_probs": _Option("BOOL", _flag),
    "return_num_input_tokens": _Option("BOOL", _flag),
    "return_num_output_tokens": _Option("BOOL", _flag),
}

_NUMPY_DTYPES = {"BYTES": np.object_, "BOOL": np.bool_, "INT32": np.int32, "UINT64": np.uint64,
                 "FP32": np.float32}
_JSON_CASTS: dict[str, Callable[[Any], Any]] = {"BYTES": list, "BOOL": bool, "INT32": int, "UINT64": int, "FP32": float}


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt and how to generate from it. Validated on construction (ValueError); the server
    validates again. `stream=True` asks for text as it is generated."""

    prompt: str
    max_tokens: int
    stream: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    stop_words: list[str] | None = None
    bad_words: list[str] | None = None
    exclude_input_in_output: bool | None = None
    return_log_probs: bool | None = None
    return_num_input_tokens: bool | None = None
    return_num_output_tokens: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ValueError(f"prompt must be a non-empty string, got {self.prompt!r}")
        _int_in(1, INT32_MAX)("max_tokens", self.max_tokens)
        _flag("stream", self.stream)
        for name, value in self._set_options().items():
            OPTIONS[name].check(name, value)

    def _set_options(self) -> dict[str, Any]:
        """The optional inputs this request sends, by name."""
        values = {name: getattr(self, name) for name in OPTIONS}
        return {name: value for name, value in values.items() if value is not None and value != []}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Ensemble input name -> array with the leading batch dim: (1, 1), or (1, n_words) for
        stop_words / bad_words. BYTES inputs are object arrays of UTF-8 bytes."""
        arrays = {
            "text_input": _array("BYTES", [self.prompt]),
            "max_tokens": _array("INT32", [self.max_tokens]),
            "stream": _array("BOOL", [self.stream]),
        }
        for name, value in self._set_options().items():
            arrays[name] = _array(OPTIONS[name].datatype, value if isinstance(value, list) else [value])
        return arrays

    def to_infer_inputs(self, infer_input: type = grpcclient.InferInput) -> list[Any]:
        """tritonclient InferInputs for the ensemble (gRPC's by default; pass
        `tritonclient.http.InferInput` for HTTP)."""
        inputs = []
        for name, array in self.to_arrays().items():
            tensor = infer_input(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def to_json(self) -> dict[str, Any]:
        """Body for POST /v2/models/{model}/generate[_stream]: scalars as plain JSON values,
        word lists as arrays; Triton shapes each into the input's batched dims."""
        body: dict[str, Any] = {"text_input": self.prompt, "max_tokens": self.max_tokens, "stream": self.stream}
        for name, value in self._set_options().items():
            body[name] = _JSON_CASTS[OPTIONS[name].datatype](value)
        return body

    def output_names(self) -> list[str]:
        """The ensemble outputs this request wants: text_output plus the extras it asked for."""
        names = ["text_output"]
        if self.return_log_probs:
            names += ["cum_log_probs", "output_log_probs"]
        if self.return_num_input_tokens:
            names.append("num_input_tokens")
        if self.return_num_output_tokens:
            names.append("num_output_tokens")
        return names


def _array(datatype: str, values: list[Any]) -> np.ndarray:
    if datatype == "BYTES":
        values = [value.encode("utf-8") for value in values]
    return np.array([values], dtype=_NUMPY_DTYPES[datatype])  # (1, n): batch of one

