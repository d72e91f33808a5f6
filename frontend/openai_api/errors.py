"""OpenAI's error object and status codes, and how Triton's error messages map onto them.

Body: {"error": {"message", "type", "param", "code"}}; the openai SDK picks its exception class from the status
(400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429 RateLimitError, 5xx InternalServerError).
Inside a gRPC stream Triton's errors arrive as text only, so the text decides (docs/rate_limiting.md lists them).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
_RETRY_AFTER = re.compile(r"retry_after_ms=(\d+)")
_ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")  # Triton's prefix on a composing model's error
_OVERLOAD = re.compile(r"\(limit max_queued_(requests|tokens)\)")  # global queue caps (docs/rate_limiting.md)
_NOT_READY = re.compile(r"Request for unknown model|is not ready|has no available versions")  # loading / unloaded


@dataclass
class OpenAIError(Exception):
    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str) -> OpenAIError:
    return OpenAIError(400, f"`{param}` is not supported by this server", param=param, code="unsupported_parameter")


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, message, type="server_error", code="service_unavailable", headers={"Retry-After": "1"})


def from_triton(message: str) -> OpenAIError:
    """The OpenAI error for an error text Triton sent for a request (in a stream, or as a gRPC status)."""
    message = _ENSEMBLE_PREFIX.sub("", message)
    if "too large to ever be admitted" in message:  # a refusal no retry can cure
        return OpenAIError(400, message, headers={"x-should-retry": "false"})
    if message.startswith("request refused:"):
        retry = _RETRY_AFTER.search(message)
        ms = int(retry.group(1)) if retry else 1000
        headers = {"retry-after-ms": str(ms), "Retry-After": str(max(1, math.ceil(ms / 1000)))}
        if _OVERLOAD.search(message):  # the server's global queue is full: overloaded, not this tenant's fault
            return OpenAIError(503, message, type="server_error", code="service_unavailable", headers=headers)
        return OpenAIError(429, message, type="rate_limit_error", code="rate_limit_exceeded", headers=headers)
    if _NOT_READY.search(message):
        return unavailable(message)
    if message.startswith("request timed out:"):
        return OpenAIError(504, message, type="timeout_error", code="timeout", headers={"x-should-retry": "false"})
    if "unauthenticated:" in message:  # the model's own check of the forwarded key (backend/policy/api_keys.py)
        return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if message.startswith(("internal error", "Failed to process the request")):
        return OpenAIError(500, message, type="server_error")
    return OpenAIError(400, message)
