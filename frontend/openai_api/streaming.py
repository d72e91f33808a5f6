"""Server-Sent Events for streamed completions and chat completions (the same order for both):
opening chunks per choice (chat: the role) -> content chunks as the engine produces them -> a finish chunk per
choice (as soon as a choice hits max_tokens, the rest when the request ends) -> the usage chunk (choices: [])
when stream_options.include_usage -> `data: [DONE]`. An error after the first byte is sent as an OpenAI error
object event, then [DONE]. A client that disconnects makes Starlette cancel this generator: the gRPC stream is
then cancelled (triton_stream.stream), which stops the engine request and frees its KV blocks.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import AsyncIterator, Protocol

from starlette.responses import StreamingResponse

from frontend.openai_api.errors import OpenAIError
from frontend.openai_api.generation import Generation, usage
from frontend.openai_api.triton_stream import Chunk

log = logging.getLogger("tritonllm.front")
DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


def sse_response(events: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream; charset=utf-8",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


class ChoiceFormat(Protocol):
    """How one route spells its choices in a chunk."""

    def opening(self, index: int) -> list[dict]: ...

    def delta(self, index: int, chunk: Chunk, prompt: int) -> dict | None: ...

    def finish(self, index: int, reason: str) -> dict: ...


async def merged(gens: list[Generation]) -> AsyncIterator[tuple[int, Chunk]]:
    """(prompt index, chunk) from every generation, in arrival order."""
    if len(gens) == 1:
        async for chunk in gens[0].chunks():
            yield 0, chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(p: int, gen: Generation) -> None:
        try:
            async for chunk in gen.chunks():
                await queue.put((p, chunk, None))
        except OpenAIError as exc:
            await queue.put((p, None, exc))
        finally:
            await queue.put((p, None, None))

    tasks = [asyncio.create_task(pump(p, g)) for p, g in enumerate(gens)]
    try:
        open_count = len(tasks)
        while open_count:
            p, chunk, error = await queue.get()
            if error is not None:
                raise error
            if chunk is None:
                open_count -= 1
                continue
            yield p, chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def sse_events(fmt: ChoiceFormat, gens: list[Generation], base: dict, include_usage: bool,
                     continuous_usage: bool) -> AsyncIterator[bytes]:
    n = gens[0].params.n
    indices = range(len(gens) * n)
    finished: set[int] = set()

    def chunk_event(choices: list[dict], with_usage: bool = continuous_usage) -> bytes:
        payload = {**base, "choices": choices}
        if with_usage:
            payload["usage"] = usage(gens)
        return event(payload)

    try:
        for index in indices:
            for choice in fmt.opening(index):
                yield chunk_event([choice])
        async for p, chunk in merged(gens):
            index = p * n + chunk.index
            choice = fmt.delta(index, chunk, p)
            if choice is not None:
                yield chunk_event([choice])
            if gens[p].reached_length(chunk.index) and index not in finished:
                finished.add(index)
                yield chunk_event([fmt.finish(index, "length")])
        for index in indices:
            if index not in finished:
                gen = gens[index // n]
                yield chunk_event([fmt.finish(index, gen.sequences[index % n].finish_reason(gen.params.max_tokens))])
        if include_usage:
            yield chunk_event([], with_usage=True)
    except OpenAIError as exc:
        log.info("front: error inside a stream: %s", exc.message)
        yield event(exc.body())
    finally:
        for gen in gens:
            await gen.aclose()
    yield DONE
