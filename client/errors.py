"""The one error type the clients raise for a failed generation."""

from __future__ import annotations

from tritonclient.utils import InferenceServerException


class GenerationError(Exception):
    """A generation request failed.

    `status` is what the server said about the failure: Triton's gRPC status string over gRPC
    (e.g. "StatusCode.INVALID_ARGUMENT"), the HTTP status code over HTTP (Triton answers 400 for an
    invalid argument), or None where there is none (an error inside a gRPC stream, a lost connection).
    `message` is the server's (or the transport's) error text.
    """

    def __init__(self, status: str | int | None, message: str) -> None:
        super().__init__(message if status is None else f"{status}: {message}")
        self.status = status
        self.message = message

    @classmethod
    def from_triton(cls, error: InferenceServerException) -> GenerationError:
        """Carry over the status and message of a tritonclient exception."""
        return cls(error.status(), error.message() or str(error))
