"""Validate KServe v2 request bodies against a model's declared inputs before Triton parses them.

Triton 2.51's HTTP JSON handling wraps integers into INT32 (`"max_tokens": 4294967304` generates 8 tokens),
answers malformed or mistyped JSON with 500, and takes seconds per 100,000 unknown fields. Here every value is
checked against its input's datatype and range, and every field must be a declared input or a known request
parameter; a failure is a RequestError whose message names the field (HTTP 400).
"""
from __future__ import annotations

from typing import Any, Iterator

from frontend.kserve.model_inputs import ELEMENT_SIZE, FLOAT_MAX, INT_RANGES, ModelSignature, Tensor

# Request-level parameters Triton or our models read (docs/rate_limiting.md, docs/canary.md, Triton's HTTP API).
KNOWN_PARAMETERS = frozenset({
    "tenant_id", "timeout_ms", "timeout", "session_id", "model_version",  # ours (policy, canary router)
    "authorization", "x-tritonllm-front-key",  # credentials (backend/policy/api_keys.py): /generate body fields
    "priority", "sequence_id", "sequence_start", "sequence_end", "binary_data_output",  # Triton's
})
_INPUT_PARAMETERS = frozenset({"binary_data_size", "shared_memory_region", "shared_memory_byte_size",
                               "shared_memory_offset"})
_OUTPUT_PARAMETERS = frozenset({"binary_data", "classification", "shared_memory_region", "shared_memory_byte_size",
                                "shared_memory_offset"})
_INFER_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
_INT64 = INT_RANGES["INT64"]


class RequestError(ValueError):
    """The body does not fit the model's inputs; the message names the field (HTTP 400)."""


def check_element(field: str, datatype: str, value: Any) -> None:
    """One tensor element as JSON gives it, against its datatype (ranges exact: no wraparound)."""
    if datatype == "BOOL":
        if not isinstance(value, bool):
            raise RequestError(f"{field} must be true or false (BOOL), got {_show(value)}")
    elif datatype in INT_RANGES:
        lo, hi = INT_RANGES[datatype]
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"{field} must be an integer ({datatype}), got {_show(value)}")
        if not lo <= value <= hi:
            raise RequestError(f"{field} is out of range for {datatype} [{lo}, {hi}], got {_show(value)}")
    elif datatype in FLOAT_MAX:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestError(f"{field} must be a number ({datatype}), got {_show(value)}")
        if abs(value) > FLOAT_MAX[datatype]:
            raise RequestError(f"{field} is out of range for {datatype}, got {_show(value)}")
    elif datatype == "BYTES":
        if not isinstance(value, str):
            raise RequestError(f"{field} must be a string (BYTES), got {_show(value)}")
    else:
        raise RequestError(f"{field} has datatype {datatype}, which this front does not accept in JSON")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _flatten(field: str, value: Any, max_depth: int) -> Iterator[Any]:
    """The elements of a JSON tensor value: a scalar, or lists nested at most max_depth deep."""
    if not isinstance(value, list):
        yield value
        return
    if max_depth == 0:
        raise RequestError(f"{field} is nested deeper than the input's {max_depth} dimensions allow")
    for item in value:
        yield from _flatten(field, item, max_depth - 1)


def check_parameters(field: str, params: Any, allowed: frozenset[str]) -> None:
    if not isinstance(params, dict):
        raise RequestError(f"{field} must be a JSON object")
    for name, value in params.items():
        if name not in allowed:
            raise RequestError(f"{field} has the unknown parameter {_show(name)} (known: {', '.join(sorted(allowed))})")
        _check_parameter_value(f"{field}.{name}", value)


def _check_parameter_value(field: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        check_element(field, "INT64", value)
    elif not isinstance(value, (str, bool, float)):
        raise RequestError(f"{field} must be a string, number or boolean, got {_show(value)}")


def validate_generate(body: Any, sig: ModelSignature, parameters: frozenset[str] = KNOWN_PARAMETERS,
                      stream: bool = True) -> None:
    """A /generate (stream False) or /generate_stream body: a flat object of input values and request parameters."""
    if not isinstance(body, dict):
        raise RequestError("the generate body must be a JSON object of input names and request parameters")
    if not stream:
        _refuse_several_responses(body)
    for name, value in body.items():
        tensor = sig.inputs.get(name)
        if tensor is None:
            if name not in parameters:
                raise RequestError(f"unknown field {_show(name)}: not an input of model {sig.name!r} nor a known "
                                   f"request parameter ({', '.join(sorted(parameters))})")
            _check_parameter_value(name, value)
            continue
        elements = list(_flatten(name, value, max(1, len(tensor.dims))))
        for element in elements:
            check_element(name, tensor.datatype, element)
        _check_count(name, tensor, len(elements))
    _check_required(sig, body.keys())


# Inputs asking the model for more than one response: Triton's /generate takes exactly one, and would say so only
# after the whole generation, with HTTP 200 (measured: 5.7 s of tokens for a {"error": ...} body).
_SEVERAL = {"stream": lambda v: v is True, "num_return_sequences": lambda v: type(v) is int and v > 1}


def _refuse_several_responses(body: dict) -> None:
    for name, several in _SEVERAL.items():
        if name in body and any(several(v) for v in _flatten(name, body[name], 32)):
            raise RequestError(f"{name} {_show(body[name])} asks for several responses; /generate returns exactly one: "
                               f"use /generate_stream")


def _check_count(field: str, tensor: Tensor, count: int) -> None:
    if all(d >= 0 for d in tensor.dims):
        expected = _product(tensor.dims)
        if count != expected:
            raise RequestError(f"{field} must hold {expected} value(s) (dims {list(tensor.dims)}), got {count}")


def _check_required(sig: ModelSignature, given: Any) -> None:
    missing = [name for name, t in sig.inputs.items() if not t.optional and name not in given]
    if missing:
        raise RequestError(f"model {sig.name!r}: missing required input(s) {missing}")


def _product(dims: Any) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def validate_infer(header: Any, sig: ModelSignature, binary_size: int,
                   parameters: frozenset[str] = KNOWN_PARAMETERS) -> None:
    """An /infer JSON body (or the JSON header of a binary-extension body followed by `binary_size` bytes)."""
    if not isinstance(header, dict):
        raise RequestError("the infer body must be a JSON object")
    unknown = sorted(set(header) - _INFER_KEYS)
    if unknown:
        raise RequestError(f"unknown field {_show(unknown[0])} in the infer body (fields: id, parameters, inputs, "
                           "outputs)")
    if "id" in header and not isinstance(header["id"], str):
        raise RequestError(f"id must be a string, got {_show(header['id'])}")
    if "parameters" in header:
        check_parameters("parameters", header["parameters"], parameters)
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("inputs must be a non-empty list")
    binary_total = sum(_check_input(i, entry, sig) for i, entry in enumerate(inputs))
    if binary_total != binary_size:
        raise RequestError(f"the inputs declare {binary_total} bytes of binary data, the body carries {binary_size}")
    _check_required(sig, {entry["name"] for entry in inputs})
    _check_outputs(header.get("outputs"), sig)


def _check_input(i: int, entry: Any, sig: ModelSignature) -> int:
    """Validate inputs[i]; returns the bytes of binary data it declares."""
    field = f"inputs[{i}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise RequestError(f"{field} must be an object with a string name")
    tensor = sig.inputs.get(entry["name"])
    field = f"input {entry['name']!r}"
    if tensor is None:
        raise RequestError(f"{field} is not an input of model {sig.name!r}")
    if entry.get("datatype") != tensor.datatype:
        raise RequestError(f"{field} has datatype {_show(entry.get('datatype'))}, the model declares {tensor.datatype}")
    shape = _check_shape(field, entry.get("shape"), tensor, sig.batched)
    params = entry.get("parameters", {})
    check_parameters(f"{field} parameters", params, _INPUT_PARAMETERS)
    if "shared_memory_region" in params:
        return 0
    if "binary_data_size" in params:
        return _check_binary(field, tensor, shape, params["binary_data_size"], "data" in entry)
    if "data" not in entry:
        raise RequestError(f"{field} has no data (nor binary_data_size / shared_memory_region)")
    elements = list(_flatten(field, entry["data"], len(shape)))
    if len(elements) != _product(shape):
        raise RequestError(f"{field} has {len(elements)} value(s), its shape {shape} needs {_product(shape)}")
    for element in elements:
        check_element(field, tensor.datatype, element)
    return 0


def _check_shape(field: str, shape: Any, tensor: Tensor, batched: bool) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise RequestError(f"{field} shape must be a list of integers, got {_show(shape)}")
    declared = ((-1,) if batched else ()) + tensor.dims
    if len(shape) != len(declared):
        raise RequestError(f"{field} shape {shape} has {len(shape)} dims, the model declares {len(declared)} "
                           f"({'batch + ' if batched else ''}{list(tensor.dims)})")
    for got, want in zip(shape, declared):
        if got < 0 or got > 2**31 - 1 or (want >= 0 and got != want):
            raise RequestError(f"{field} shape {shape} does not fit the declared dims {list(declared)}")
    return shape


def _check_binary(field: str, tensor: Tensor, shape: list[int], size: Any, has_data: bool) -> int:
    if has_data:
        raise RequestError(f"{field} has both data and binary_data_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RequestError(f"{field} binary_data_size must be a non-negative integer, got {_show(size)}")
    element = ELEMENT_SIZE.get(tensor.datatype)
    if element is not None and size != element * _product(shape):
        raise RequestError(f"{field} binary_data_size is {size}, its shape {shape} of {tensor.datatype} needs "
                           f"{element * _product(shape)}")
    return size


def _check_outputs(outputs: Any, sig: ModelSignature) -> None:
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise RequestError("outputs must be a list")
    for i, entry in enumerate(outputs):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise RequestError(f"outputs[{i}] must be an object with a string name")
        if entry["name"] not in sig.outputs:
            raise RequestError(f"output {entry['name']!r} is not an output of model {sig.name!r}")
        if "parameters" in entry:
            check_parameters(f"output {entry['name']!r} parameters", entry["parameters"], _OUTPUT_PARAMETERS)
