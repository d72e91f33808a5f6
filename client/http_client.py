"""Generation over Triton's HTTP generate extension: POST /v2/models/{model}/generate (one JSON
response) and /generate_stream (Server-Sent Events)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import requests

from client.errors import GenerationError
from client.request import GenerationRequest
from client.response import TextChunk, chunk_from_outputs
from client.sse import parse_sse, parse_sse_json

CONNECT_TIMEOUT_S = 10.0


class HttpLLMClient:
    """Client of the ensemble over HTTP. Stateless between calls (no shared session), so one
    client may serve several threads at once."""

    def __init__(self, url: str = "http://localhost:8000", model: str = "ensemble", timeout_s: float = 120.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url if "://" in url else f"http://{url}"
        self.model = model
        self.timeout_s = timeout_s  # the longest wait for any byte of the response

    def endpoint(self, name: str) -> str:
        """URL of the model's `generate` or `generate_stream` endpoint."""
        return f"{self.url.rstrip('/')}/v2/models/{self.model}/{name}"

    def complete(self, req: GenerationRequest) -> TextChunk:
        """The whole generation as one chunk, via /generate (which wants exactly one response,
        so the request is sent with stream=False whatever `req.stream` says)."""
        with _transport_errors():
            response = self._post("generate", replace(req, stream=False), stream=False)
            body = response.json()
        if "error" in body:  # Triton may answer 200 with an error body here
            raise GenerationError(response.status_code, str(body["error"]))
        chunk = chunk_from_outputs(body.get, req.output_names())
        if chunk is None:
            raise GenerationError(response.status_code, f"response has no text_output: {body!r}")
        return chunk

    def generate(self, req: GenerationRequest) -> str:
        """The whole generated text, via /generate."""
        return self.complete(req).text

    def generate_stream(self, req: GenerationRequest) -> Iterator[TextChunk]:
        """Yield chunks as the server sends them, via /generate_stream (one chunk when
        `req.stream` is False). An error event raises GenerationError with the HTTP status of
        the stream (200: Triton sets it at the first event). Closing early drops the connection."""
        with _transport_errors():
            response = self._post("generate_stream", req, stream=True)
            with response:
                for event in parse_sse_json(response.iter_lines(chunk_size=None)):
                    if "error" in event:
                        raise GenerationError(response.status_code, str(event["error"]))
                    chunk = chunk_from_outputs(event.get, req.output_names())
                    if chunk is not None:
                        yield chunk

    def _post(self, endpoint: str, req: GenerationRequest, stream: bool) -> requests.Response:
        response = requests.post(
            self.endpoint(endpoint), json=req.to_json(), stream=stream, timeout=(CONNECT_TIMEOUT_S, self.timeout_s)
        )
        if response.status_code != 200:
            raise GenerationError(response.status_code, error_message(response.text, response.reason))
        return response


@contextmanager
def _transport_errors() -> Iterator[None]:
    """Turn connection failures, timeouts and unreadable bodies into GenerationError(None, ...)."""
    try:
        yield
    except (requests.RequestException, ValueError) as error:  # json decode errors are ValueErrors
        raise GenerationError(None, f"{type(error).__name__}: {error}") from None


def error_message(body: str, fallback: str) -> str:
    """The `error` of a Triton error body: plain JSON, or an SSE `data:` event when
    generate_stream fails at its first response. Else the body itself, or `fallback` if empty."""
    for candidate in [body, *parse_sse(body.splitlines())]:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict) and "error" in parsed:
            return str(parsed["error"])
    return body.strip() or fallback
