"""One prompt's generation through the ensemble, with per-sequence accounting: text, token ids (usage counts
them), log-probs, and finish_reason.

finish_reason: the engine drops the end token and a matched stop word from the output and ends with "length"
exactly when the output reached max_tokens, so a sequence whose output holds max_tokens tokens ended on length,
any other on stop (EOS or a stop string).

The ensemble request is always streamed, also for a non-streamed answer: Triton does not mark an ensemble's
in-flight composing request cancelled when the client cancels; the engine request learns it from postprocessing,
at its next streamed response (model_repository/postprocessing). A request that sends one response at the end
would run to completion after its client left; a streamed one stops within a step.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

import tritonclient.grpc.aio as grpcclient

from frontend.openai_api.params import GenerationParams
from frontend.openai_api.triton_stream import Chunk, UpstreamRequest, stream


@dataclass
class SequenceState:
    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)

    def add(self, chunk: Chunk) -> None:
        self.text.append(chunk.text)
        self.token_ids.extend(t for t in chunk.token_ids if t >= 0)
        self.log_probs.extend(chunk.log_probs)
        self.top.extend(chunk.top)

    def finish_reason(self, max_tokens: int) -> str:
        return "length" if len(self.token_ids) >= max_tokens else "stop"


@dataclass(frozen=True)
class Caller:
    """Who asks and how: the tenant (sent as the tenant header, which Triton forwards to the models), the
    request id (X-Request-Id), the deadline and the sticky-routing key (OpenAI's `user`)."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    headers: dict[str, str] = field(default_factory=dict)
    timeout_ms: int | None = None
    user: str | None = None

    def parameters(self) -> dict[str, str | int]:
        params: dict[str, str | int] = {}
        if self.timeout_ms is not None:
            params["timeout_ms"] = self.timeout_ms
        if self.user:
            params["session_id"] = self.user
        return params


class Generation:
    """The responses of one prompt's request. `first()` waits for the first response, so that a refusal or a bad
    argument becomes the HTTP status before any byte of a streamed answer; iterate for the chunks after it."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str, prompt: str, params: GenerationParams,
                 caller: Caller, tag: str = "") -> None:
        self.params = params
        self.sequences = {i: SequenceState(i) for i in range(params.n)}
        self.prompt_tokens = 0
        request = UpstreamRequest(model=model, inputs=params.inputs(prompt, stream=True), outputs=params.outputs(),
                                  request_id=caller.request_id + tag, headers=caller.headers,
                                  parameters=caller.parameters())
        self._chunks: AsyncIterator[Chunk] = stream(client, request)
        self._pending: Chunk | None = None

    async def first(self) -> None:
        """Pull the first response (raises the request's OpenAIError, if any)."""
        try:
            self._pending = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._pending = None

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every chunk, accounted into `sequences` before it is yielded."""
        try:
            if self._pending is not None:
                pending, self._pending = self._pending, None
                yield self._account(pending)
            async for chunk in self._chunks:
                yield self._account(chunk)
        finally:
            await self._chunks.aclose()

    async def aclose(self) -> None:
        """Stop the request if it is still running (cancels it in the engine)."""
        await self._chunks.aclose()

    def _account(self, chunk: Chunk) -> Chunk:
        if chunk.num_input_tokens is not None:
            self.prompt_tokens = chunk.num_input_tokens
        self.sequences.setdefault(chunk.index, SequenceState(chunk.index)).add(chunk)
        return chunk

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.sequences.values())

    def reached_length(self, index: int) -> bool:
        return len(self.sequences[index].token_ids) >= self.params.max_tokens


def usage(generations: list[Generation]) -> dict[str, int]:
    prompt = sum(g.prompt_tokens for g in generations)
    completion = sum(g.completion_tokens for g in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
