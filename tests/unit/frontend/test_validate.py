"""KServe v2 bodies against a model's declared inputs: generate (flat object) and infer (JSON or binary header)."""
from __future__ import annotations

import re

import pytest

from frontend.kserve.model_inputs import ModelSignature
from frontend.kserve.validate import RequestError, check_element, validate_generate, validate_infer

# As Triton's GET /v2/models/ensemble/config returns it (dims as strings: int64 in protobuf JSON).
CONFIG = {
    "name": "ensemble", "max_batch_size": 64,
    "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": ["1"]},
              {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": ["1"]},
              {"name": "stop_words", "data_type": "TYPE_STRING", "dims": ["-1"], "optional": True},
              {"name": "seed", "data_type": "TYPE_UINT64", "dims": ["1"], "optional": True},
              {"name": "temperature", "data_type": "TYPE_FP32", "dims": ["1"], "optional": True},
              {"name": "stream", "data_type": "TYPE_BOOL", "dims": ["1"], "optional": True}],
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": ["-1"]}],
}
SIG = ModelSignature.from_config(CONFIG)


def test_signature_from_config():
    assert SIG.batched and SIG.inputs["max_tokens"].datatype == "INT32" and SIG.inputs["max_tokens"].dims == (1,)
    assert SIG.inputs["text_input"].datatype == "BYTES" and SIG.inputs["seed"].optional


def test_a_good_generate_body_passes():
    validate_generate({"text_input": "def ", "max_tokens": 8, "stop_words": ["\n", "#"], "seed": 2**64 - 1,
                       "temperature": 0.5, "stream": True, "tenant_id": "acme", "timeout_ms": 5000}, SIG)
    validate_generate({"text_input": ["def "], "max_tokens": [8]}, SIG)  # a list of one for a [1] input


@pytest.mark.parametrize("body, message", [
    ({"text_input": "a", "max_tokens": 4294967304}, "max_tokens is out of range for INT32"),
    ({"text_input": "a", "max_tokens": 8, "seed": -1}, "seed is out of range for UINT64"),
    ({"text_input": "a", "max_tokens": 8.0}, "max_tokens must be an integer"),
    ({"text_input": "a", "max_tokens": True}, "max_tokens must be an integer"),
    ({"text_input": "a", "max_tokens": 8, "stream": 1}, "stream must be true or false"),
    ({"text_input": "a", "max_tokens": 8, "temperature": 1e39}, "temperature is out of range for FP32"),
    ({"text_input": "a", "max_tokens": [8, 9]}, "max_tokens must hold 1 value"),
    ({"text_input": "a", "max_tokens": [[8]]}, "nested deeper"),
    ({"text_input": "a", "max_tokens": 8, "x": 1}, "unknown field 'x'"),
    ({"text_input": "a", "max_tokens": 8, "tenant_id": ["a"]}, "tenant_id must be a string, number or boolean"),
    ({"text_input": "a"}, "model 'ensemble': missing required input(s) ['max_tokens']"),
    ([], "must be a JSON object"),
])
def test_generate_refusals_name_the_field(body, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        validate_generate(body, SIG)


def _infer(**overrides):
    body = {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]},
                       {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [[8]]}],
            "outputs": [{"name": "text_output", "parameters": {"binary_data": True}}],
            "parameters": {"binary_data_output": True}}
    body.update(overrides)
    return body


def test_a_good_infer_body_passes_json_and_binary():
    validate_infer(_infer(), SIG, 0)
    binary = _infer()
    binary["inputs"][1] = {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32",
                           "parameters": {"binary_data_size": 4}}
    validate_infer(binary, SIG, 4)


@pytest.mark.parametrize("mutate, binary_size, message", [
    (lambda b: b["inputs"][1].update(data=[[4294967304]]), 0, "out of range for INT32"),
    (lambda b: b["inputs"][1].update(datatype="INT64"), 0, "has datatype 'INT64', the model declares INT32"),
    (lambda b: b["inputs"][1].update(shape=[1]), 0, "has 1 dims, the model declares 2"),
    (lambda b: b["inputs"][1].update(shape=[1, 2]), 0, "does not fit the declared dims"),
    (lambda b: b["inputs"][1].update(data=[8, 9]), 0, "its shape [1, 1] needs 1"),
    (lambda b: b["inputs"][0].update(name="nope"), 0, "'nope' is not an input"),
    (lambda b: b.update(extra=1), 0, "unknown field 'extra'"),
    (lambda b: b["outputs"].append({"name": "nope"}), 0, "'nope' is not an output"),
    (lambda b: b["parameters"].update(colour="blue"), 0, "unknown parameter 'colour'"),
    (lambda b: b["inputs"][1].update(parameters={"binary_data_size": 8}, data=None) or b["inputs"][1].pop("data"),
     8, "binary_data_size is 8, its shape [1, 1] of INT32 needs 4"),
    (lambda b: None, 4, "declare 0 bytes of binary data, the body carries 4"),
    (lambda b: b["inputs"].pop(1), 0, "missing required input(s)"),
])
def test_infer_refusals_name_the_problem(mutate, binary_size, message):
    body = _infer()
    mutate(body)
    with pytest.raises(RequestError) as err:
        validate_infer(body, SIG, binary_size)
    assert message in str(err.value)


def test_element_checks_cover_every_datatype():
    check_element("x", "UINT8", 255)
    check_element("x", "INT64", -(2**63))
    check_element("x", "FP16", 65504)
    for datatype, value in (("UINT8", 256), ("INT8", -129), ("INT64", 2**63), ("FP16", 70000.0)):
        with pytest.raises(RequestError, match="out of range"):
            check_element("x", datatype, value)
    with pytest.raises(RequestError, match="does not accept"):
        check_element("x", "TYPE_UNKNOWN", 1)


@pytest.mark.parametrize("body", [{"stream": True}, {"stream": [True]}, {"num_return_sequences": 2},
                                  {"num_return_sequences": [3]}])
def test_generate_refuses_what_needs_several_responses(body):
    """Triton's /generate takes exactly one response; it would say so only after the whole generation, as HTTP 200."""
    sig = ModelSignature.from_config({**CONFIG, "input": CONFIG["input"] + [
        {"name": "num_return_sequences", "data_type": "TYPE_INT32", "dims": ["1"], "optional": True}]})
    with pytest.raises(RequestError, match="use /generate_stream"):
        validate_generate({"text_input": "def ", "max_tokens": 8, **body}, sig, stream=False)
    validate_generate({"text_input": "def ", "max_tokens": 8, **body}, sig, stream=True)
    validate_generate({"text_input": "def ", "max_tokens": 8, "stream": False, "num_return_sequences": 1}, sig,
                      stream=False)
