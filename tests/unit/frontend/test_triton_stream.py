"""When the front cancels its gRPC stream to Triton (frontend/openai_api/triton_stream.py): only when the caller goes
away or an errored stream does not end by itself, never right after a request's final (error) response, which could
leave Triton 2.51's stream handler holding the ensemble (tests/integration/test_openai_tenants.py checks the served
outcome). Triton's side is stood in for by the response iterator tritonclient.grpc.aio hands back: (result, error)
pairs, and cancel()."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from frontend.openai_api import triton_stream
from frontend.openai_api.errors import OpenAIError
from frontend.openai_api.triton_stream import UpstreamRequest, stream

REQUEST = UpstreamRequest(model="ensemble", inputs={"text_input": np.array([[b"hi"]], dtype=object)},
                          outputs=["text_output"], request_id="r", headers={})


class _Result:
    def __init__(self, text: str) -> None:
        self.arrays = {"text_output": np.array([text.encode()], dtype=object)}

    def as_numpy(self, name: str):
        return self.arrays.get(name)


class _Responses:
    """The responses of one stream; `hang`: after them the stream stays open (no end) until cancelled."""

    def __init__(self, items: list, hang: bool = False) -> None:
        self.items, self.hang = list(items), hang
        self.cancelled = False
        self.read_to_end = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        if self.hang:
            await asyncio.sleep(3600)
        self.read_to_end = True
        raise StopAsyncIteration

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class _Client:
    def __init__(self, responses: _Responses) -> None:
        self.responses = responses

    def stream_infer(self, inputs_iterator, headers=None):
        return self.responses


def _refusal():
    return None, InferenceServerException(msg="request refused: tenant 'slow' is over requests_per_s; retry in 900 ms")


def _collect(responses: _Responses, take: int | None = None) -> list[str]:
    async def run():
        texts, chunks = [], stream(_Client(responses), REQUEST)
        async for chunk in chunks:
            texts.append(chunk.text)
            if take is not None and len(texts) == take:
                await chunks.aclose()  # the caller goes away
                break
        return texts

    return asyncio.run(run())


def test_an_error_lets_the_stream_end_instead_of_cancelling_it():
    responses = _Responses([_refusal(), (_Result("never read"), None)])
    with pytest.raises(OpenAIError) as err:
        _collect(responses)
    assert err.value.status == 429
    assert responses.read_to_end and not responses.cancelled


def test_an_errored_stream_that_does_not_end_is_cancelled(monkeypatch):
    monkeypatch.setattr(triton_stream, "_END_WAIT_S", 0.05)
    responses = _Responses([_refusal()], hang=True)
    with pytest.raises(OpenAIError):
        _collect(responses)
    assert responses.cancelled


def test_a_caller_gone_mid_stream_cancels_the_request():
    responses = _Responses([(_Result("a"), None), (_Result("b"), None)], hang=True)
    assert _collect(responses, take=1) == ["a"]
    assert responses.cancelled


def test_a_stream_read_to_its_end_is_not_cancelled():
    responses = _Responses([(_Result("a"), None), (_Result("b"), None)])
    assert _collect(responses) == ["a", "b"]
    assert responses.read_to_end and not responses.cancelled
