"""One ensemble request over Triton's gRPC streaming API (tritonclient.grpc.aio), as an async iterator of
per-response chunks. The request goes out on one bidirectional stream which the client half-closes after sending;
Triton ends the stream once every response of the request was sent, so the iterator ends with the request.
Closing the iterator early (client gone) cancels the gRPC call, which cancels the request in the engine and frees
its KV blocks. A request that ended in an error (a refusal, a bad argument) is not cancelled: its stream is left to
end by itself (_ended), because a cancel just after the final response can leave Triton 2.51's stream handler
waiting for a callback that never comes ("Waiting for the callback to retrieve cancellation", verbose log), holding
the model: the ensemble then never unloads and a server stop waits out its whole exit timeout (perf/ISSUE16.md,
"A refused request that held the ensemble")."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import np_to_triton_dtype

from frontend.openai_api.errors import OpenAIError, from_triton, unavailable


@dataclass(frozen=True)
class Chunk:
    """One ensemble response: a piece of one sequence's text, and what came with it."""

    index: int  # sequence_index: which of the n sequences
    text: str
    num_input_tokens: int | None
    num_output_tokens: int | None  # as the engine counts them for this sequence (see usage.py)
    token_ids: list[int] = field(default_factory=list)  # with logprobs: the tokens of this response
    log_probs: list[float] = field(default_factory=list)  # with logprobs: one per token
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # with top_logprobs: (id, log-prob) per token


@dataclass(frozen=True)
class UpstreamRequest:
    model: str
    inputs: dict[str, np.ndarray]
    outputs: list[str]
    request_id: str
    headers: dict[str, str]  # forwarded by Triton as request parameters (tenant header)
    parameters: dict[str, str | int] = field(default_factory=dict)  # timeout_ms, session_id


def _infer_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


_END_WAIT_S = 2.0  # how long an errored request's stream gets to end by itself (it takes ~1 ms) before a cancel


async def _ended(responses, timeout_s: float = _END_WAIT_S) -> bool:
    """Whether the stream ends by itself within timeout_s (its remaining responses dropped): after an error response
    Triton ends it as soon as the request's final response is out, and an error is final from our models."""

    async def rest() -> None:
        async for _ in responses:
            pass

    try:
        await asyncio.wait_for(rest(), timeout_s)
    except (asyncio.TimeoutError, grpc.aio.AioRpcError):
        return False
    return True


async def stream(client: grpcclient.InferenceServerClient, req: UpstreamRequest) -> AsyncIterator[Chunk]:
    """The responses of `req` as Chunks; raises OpenAIError for an error Triton sends or a failed transport."""

    async def one_request():
        yield {"model_name": req.model, "inputs": _infer_inputs(req.inputs),
               "outputs": [grpcclient.InferRequestedOutput(n) for n in req.outputs],
               "request_id": req.request_id, "parameters": req.parameters or None}

    responses = client.stream_infer(inputs_iterator=one_request(), headers=req.headers)
    finished = False
    try:
        async for result, error in responses:
            if error is not None:
                finished = await _ended(responses)  # no cancel after the final response (the module says why)
                raise from_triton(error.message() or str(error))
            chunk = to_chunk(result)
            if chunk is not None:
                yield chunk
        finished = True
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise unavailable(f"tritonserver is not reachable: {exc.details()}") from None
        raise OpenAIError(502, f"tritonserver stream failed: {exc.code().name}: {exc.details()}",
                          type="server_error") from None
    finally:
        if not finished:
            responses.cancel()  # the client went away (or an errored stream did not end): stop the engine request


def _first(result, name: str) -> int | None:
    array = result.as_numpy(name)
    return None if array is None or array.size == 0 else int(array.reshape(-1)[0])


def to_chunk(result) -> Chunk | None:
    """A Chunk from an InferResult; None for a response without text (an empty final response)."""
    text = result.as_numpy("text_output")
    if text is None:
        return None
    flat = text.reshape(-1)
    value = flat[0] if flat.size else b""
    token_ids = result.as_numpy("output_token_ids")
    log_probs = result.as_numpy("output_log_probs")
    top_ids, top_lps = result.as_numpy("top_log_probs_ids"), result.as_numpy("top_log_probs")
    top = []
    if top_ids is not None and top_lps is not None and top_ids.size:
        k = top_ids.shape[-1]
        top = [list(zip(map(int, ids), map(float, lps)))
               for ids, lps in zip(top_ids.reshape(-1, k), top_lps.reshape(-1, k))]
    return Chunk(
        index=_first(result, "sequence_index") or 0,
        text=value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value),
        num_input_tokens=_first(result, "num_input_tokens"),
        num_output_tokens=_first(result, "num_output_tokens"),
        token_ids=[] if token_ids is None else [int(t) for t in token_ids.reshape(-1)],
        log_probs=[] if log_probs is None else [float(x) for x in log_probs.reshape(-1)],
        top=top,
    )
