"""copy_request: owned copies of the present inputs, and the request parameters."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from backend.serving.request_copy import copy_request


def test_present_inputs_are_copied_and_parameters_parsed():
    source = {"text_input": np.array([[b"def "]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    pb_utils = SimpleNamespace(get_input_tensor_by_name=lambda request, name: (
        SimpleNamespace(as_numpy=lambda: source[name]) if name in source else None))
    request = SimpleNamespace(parameters=lambda: '{"tenant_id": "acme"}')
    arrays, params = copy_request(pb_utils, request, ["text_input", "max_tokens", "stop"])
    assert set(arrays) == {"text_input", "max_tokens"} and params == {"tenant_id": "acme"}
    source["max_tokens"][0, 0] = 99  # the request's memory goes away; the copy does not follow it
    assert arrays["max_tokens"][0, 0] == 8
    assert copy_request(pb_utils, SimpleNamespace(parameters=lambda: ""), [])[1] == {}
