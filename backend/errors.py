"""Errors every layer shares (a leaf module: it imports nothing of ours)."""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine refuses: the message says which field is wrong and why (Triton INVALID_ARG)."""


class UnavailableError(RuntimeError):
    """The server cannot finish this request now (shutting down, restarting): Triton UNAVAILABLE, worth retrying
    on another replica or later. The message says why."""
