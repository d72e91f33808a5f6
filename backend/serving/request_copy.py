"""A Triton request's inputs and parameters copied out of it, for the BLS models (tensorrt_llm_bls, router) that
serve a request on a thread of their own: the request's tensors are released once execute() returns."""
from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np


def copy_request(pb_utils: Any, request: Any, input_names: Iterable[str]) -> tuple[dict[str, np.ndarray], dict]:
    """(the present inputs by name, owned copies; the request parameters: credentials, tenant, routing key).
    pb_utils is passed in: Triton provides it only inside a model process."""
    arrays = {}
    for name in input_names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = np.array(tensor.as_numpy(), copy=True)
    return arrays, json.loads(request.parameters() or "{}")
