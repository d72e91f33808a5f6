"""Generation over Triton's gRPC streaming API (the ensemble is decoupled, so every request,
streamed or not, goes through the bidirectional stream)."""

from __future__ import annotations

import queue
import time
import uuid
from functools import partial
from typing import Iterator

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.errors import GenerationError
from client.request import GenerationRequest
from client.response import TextChunk, chunk_from_outputs

# What the stream callback hands over: (result, None) or (None, error).
Response = tuple["grpcclient.InferResult | None", "InferenceServerException | None"]


class GrpcLLMClient:
    """Client of the ensemble over gRPC. Each `generate` opens its own stream, so one client may
    serve several threads at once."""

    def __init__(self, url: str = "localhost:8001", model: str = "ensemble", timeout_s: float = 120.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self.model = model
        self.timeout_s = timeout_s  # for the whole request, first byte to final response

    def generate(self, req: GenerationRequest, request_id: str | None = None) -> Iterator[TextChunk]:
        """Yield the text of `req` as it arrives: chunk by chunk when `req.stream`, else one chunk.

        The request is sent on the first `next()`. Ends at Triton's final-response flag; raises
        GenerationError on a server error or when `timeout_s` passes (then the request is cancelled).
        Errors Triton reports inside the stream (invalid argument, unknown model) carry only a
        message, so their status is None; transport failures carry a gRPC status ("StatusCode.
        UNAVAILABLE"). Closing the iterator early cancels the request on the server.
        """
        responses: queue.Queue[Response] = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        finished = False
        try:
            client.start_stream(callback=partial(_enqueue, responses))
            client.async_stream_infer(
                self.model,
                req.to_infer_inputs(),
                outputs=[grpcclient.InferRequestedOutput(name) for name in req.output_names()],
                request_id=request_id or uuid.uuid4().hex,
                enable_empty_final_response=True,
            )
            deadline = time.monotonic() + self.timeout_s
            while not finished:
                result = next_result(responses, deadline)
                finished = is_final_response(result)
                chunk = chunk_from_outputs(result.as_numpy, req.output_names())
                if chunk is not None:
                    yield chunk
        except InferenceServerException as error:
            raise GenerationError.from_triton(error) from None
        finally:
            client.stop_stream(cancel_requests=not finished)
            client.close()


def _enqueue(responses: queue.Queue[Response], result: grpcclient.InferResult | None,
             error: InferenceServerException | None) -> None:
    responses.put((result, error))


def next_result(responses: queue.Queue[Response], deadline: float) -> grpcclient.InferResult:
    """The next response of the stream; raises GenerationError for an error response or when
    nothing arrives before `deadline` (time.monotonic())."""
    try:
        result, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise GenerationError("StatusCode.DEADLINE_EXCEEDED", "no final response within the client timeout") from None
    if error is not None:
        raise GenerationError.from_triton(error)
    assert result is not None
    return result


def is_final_response(result: grpcclient.InferResult) -> bool:
    """Whether Triton marked this response the request's last (needs enable_empty_final_response)."""
    return result.get_response().parameters["triton_final_response"].bool_param
