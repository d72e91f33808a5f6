"""How an accepted request's error reaches an ensemble client: as data through postprocessing, not as a step error.

Why: Triton 2.51's ensemble scheduler, once a step answers with an error, stops counting the request's other steps
as they finish (EnsembleContext::PrepareSteps skips UpdateEnsembleState when the ensemble status is an error; fixed
in triton-inference-server/core only in 2026, PR 466). A tensorrt_llm error that arrives while postprocessing still
handles the request's previous response therefore leaves the ensemble request in flight for good: the model never
unloads (a reload keeps the old version; the server's stop waits out its exit timeout). A stream's deadline or a
failure in the engine lands so whenever the tokens are flowing.

How: the ensemble's preprocessing sets `errors_in_stream`; tensorrt_llm (decoupled) then ends a request it had
accepted, when it fails, with a final response holding `stream_error` = [code, message] (and empty output_ids), the
last response of its stream. Postprocessing, the last step, with one instance, handles a stream's responses in
order: when it answers the stream_error with that error, no other step of the request is left running. The client
sees the same error as before, prefixed by Triton's "in ensemble 'ensemble', ". Direct clients of tensorrt_llm and
the BLS model do not set the input and get Triton errors, as from the anchor.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from backend.errors import InvalidRequestError
from backend.serving.response_group import ROW_ERROR_CODES

INPUT = "errors_in_stream"  # tensorrt_llm's input (BOOL): send errors as stream_error responses
OUTPUT = "stream_error"  # tensorrt_llm's output: [code, message] (bytes), in its stream's final response
POSTPROCESSING_INPUT = "STREAM_ERROR"
CODES = ROW_ERROR_CODES  # the pb_utils.TritonError codes a stream_error may carry: a RowError's


def wanted(inputs: Mapping[str, np.ndarray], decoupled: bool) -> bool:
    """Whether this request's errors are to go as stream_error responses: only decoupled (a unary request has its
    one response, no other step can be running beside it)."""
    value = inputs.get(INPUT)
    if value is None or value.size == 0:
        return False
    if value.dtype != np.bool_:
        raise InvalidRequestError(f"{INPUT} must be BOOL, got {value.dtype}")
    return decoupled and bool(value.reshape(-1)[0])


def error_tensors(code: str, message: str, request_key: int) -> dict[str, np.ndarray]:
    """The final response that carries an error: no tokens (postprocessing's required inputs are there), the
    request's key (postprocessing forgets its stream), stream_error (1, 2). code: a RowError's (checked there)."""
    return {
        "output_ids": np.zeros((1, 1, 0), dtype=np.int32),
        "sequence_length": np.zeros((1, 1), dtype=np.int32),
        "stream_final": np.ones((1, 1), dtype=bool),
        "request_key": np.array([[request_key]], dtype=np.uint64),
        OUTPUT: np.array([[code.encode(), message.encode("utf-8", "replace")]], dtype=object),
    }


def read(value: np.ndarray) -> tuple[str, str]:
    """Postprocessing's side: (code, message) from STREAM_ERROR (batch, 2); INVALID_ARG when it is not one."""
    flat = value.reshape(-1)
    if flat.size != 2:
        raise InvalidRequestError(f"{POSTPROCESSING_INPUT} must hold [code, message], got shape {list(value.shape)}")
    code, message = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat)
    if code not in CODES:
        raise InvalidRequestError(f"{POSTPROCESSING_INPUT} code must be one of {', '.join(CODES)}, got {code[:40]!r}")
    return code, message
