"""Streamed answers without a server: the event order (role, content, finish as soon as known, usage, [DONE]),
usage from the generated token ids, finish_reason from max_tokens, errors inside a stream, log-prob objects."""
from __future__ import annotations

import asyncio
import json

import pytest

from frontend.openai_api import generation
from frontend.openai_api.chat import ChatFormat
from frontend.openai_api.errors import OpenAIError
from frontend.openai_api.generation import Caller, Generation
from frontend.openai_api.logprobs import chat_logprobs, completion_logprobs
from frontend.openai_api.params import GenerationParams
from frontend.openai_api.streaming import sse_events
from frontend.openai_api.triton_stream import Chunk


def _fake_stream(chunks: list[Chunk | Exception]):
    async def stream(client, request):
        for item in chunks:
            if isinstance(item, Exception):
                raise item
            yield item

    return stream


def _events(monkeypatch, chunks, n=2, max_tokens=2, include_usage=True) -> list:
    monkeypatch.setattr(generation, "stream", _fake_stream(chunks))
    gen = Generation(None, "ensemble", "hi", GenerationParams(max_tokens=max_tokens, n=n), Caller())

    async def collect():
        await gen.first()
        fmt = ChatFormat(None, "assistant", "", logprobs=False)
        return [e async for e in sse_events(fmt, [gen], {"id": "x"}, include_usage, False)]

    raw = asyncio.run(collect())
    assert raw[-1] == b"data: [DONE]\n\n"
    return [json.loads(e[6:]) for e in raw[:-1]]


def test_chat_stream_order_usage_and_finish_reasons(monkeypatch):
    chunks = [Chunk(0, "a", 7, None, token_ids=[11]), Chunk(1, "b", 7, None, token_ids=[12]),
              Chunk(0, "c", 7, None, token_ids=[13]), Chunk(1, "", 7, None, token_ids=[])]  # seq 1 ends on EOS
    events = _events(monkeypatch, chunks)
    choices = [e["choices"] for e in events]
    assert choices[0] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None}]
    assert choices[1][0]["index"] == 1 and choices[1][0]["delta"]["role"] == "assistant"
    assert [c[0]["delta"].get("content") for c in choices[2:5]] == ["a", "b", "c"]
    assert choices[5] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]  # at once
    assert choices[6] == [{"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"}]  # at the end
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                                   "total_tokens": 10}


def test_error_inside_a_stream_is_an_error_event_then_done(monkeypatch):
    events = _events(monkeypatch, [Chunk(0, "a", 3, None, token_ids=[1]), OpenAIError(400, "boom")], n=1,
                     max_tokens=5)
    assert events[-1] == {"error": {"message": "boom", "type": "invalid_request_error", "param": None, "code": None}}


def test_first_response_error_surfaces_before_streaming(monkeypatch):
    monkeypatch.setattr(generation, "stream", _fake_stream([OpenAIError(429, "request refused: x")]))
    gen = Generation(None, "ensemble", "hi", GenerationParams(max_tokens=2), Caller())
    with pytest.raises(OpenAIError) as err:
        asyncio.run(gen.first())
    assert err.value.status == 429


def test_caller_parameters():
    assert Caller(timeout_ms=500, user="u1").parameters() == {"timeout_ms": 500, "session_id": "u1"}
    assert Caller().parameters() == {}


class _Tokenizer:
    """Token i is the text 't<i>'."""

    def token_strings(self, ids):
        return [f"t{i}" for i in ids]


def test_logprob_objects():
    top = [[(5, -0.1), (6, -2.0)], [(7, -0.3), (5, -1.0)]]
    comp = completion_logprobs(_Tokenizer(), [5, 7], [-0.1, float("-inf")], top, text_start=3)
    assert comp["tokens"] == ["t5", "t7"] and comp["text_offset"] == [3, 5]
    assert comp["token_logprobs"] == [-0.1, -9999.0]  # clamped: JSON stays finite
    assert comp["top_logprobs"][0] == {"t5": -0.1, "t6": -2.0}
    chat = chat_logprobs(_Tokenizer(), [5], [-0.1], top[:1])
    assert chat == {"content": [{"token": "t5", "logprob": -0.1, "bytes": [116, 53], "top_logprobs": [
        {"token": "t5", "logprob": -0.1, "bytes": [116, 53]}, {"token": "t6", "logprob": -2.0, "bytes": [116, 54]}]}]}
