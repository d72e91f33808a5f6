"""The canary router's forwarding of one request to one version, as a state machine without Triton.

The router (model_repository/router/1/model.py) sends a request to the chosen version of the LLM model and
forwards that version's responses. What it must get right, decided here and unit-tested:
- how many final responses the client is owed (one per returned sequence: `finals`), so the response that
  completes the last one carries Triton's FINAL flag, and an empty final is sent if the version ends early;
- when a failure means "the version went away before we sent anything" (unloaded between the routing choice
  and the call, during a promotion): then the request is routed again instead of failing.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import numpy as np

from backend.serving import stream_errors


class Outcome(str, enum.Enum):
    """How forwarding one request to one version ended (the router metrics' `outcome` label)."""

    OK = "ok"  # every final response forwarded
    ERROR = "error"  # an error went to the client
    GONE = "gone"  # the version went away before anything was sent: route the request again (not counted)


def is_final(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether a response of the LLM model ends one returned sequence (its `stream_final` output)."""
    final = arrays.get("stream_final")
    return final is not None and bool(final.reshape(-1)[0])


class Forwarding:
    """One request's responses from one version: call on_error / on_tensors per response, then needs_final()."""

    def __init__(self, finals: int, retry_allowed: bool) -> None:
        if finals < 1:
            raise ValueError(f"a request is owed at least one final response, got {finals}")
        self.finals = finals
        self.retry_allowed = retry_allowed  # False for a pinned request: its version or an error, nothing else
        self.sent = 0  # responses forwarded to the client
        self.done = 0  # final responses among them
        self.failed = False  # a stream_error response was forwarded: the request's error (stream_errors.py)

    @property
    def complete(self) -> bool:
        """Every final response was forwarded: whatever the version still sends is dropped."""
        return self.done >= self.finals

    def on_error(self, version_gone: Callable[[], bool]) -> Outcome:
        """An error response, or the call failing: GONE when nothing was sent yet, a retry is allowed and the
        version is no longer ready (asked only then); else ERROR (the error goes to the client)."""
        if self.sent == 0 and self.retry_allowed and version_gone():
            return Outcome.GONE
        return Outcome.ERROR

    def on_tensors(self, arrays: Mapping[str, np.ndarray]) -> bool | None:
        """A successful response's tensors: None to drop it (empty, or the version's own empty final after the
        last forwarded one), else whether the forwarded response must carry the FINAL flag."""
        if self.complete or not arrays:
            return None
        if stream_errors.OUTPUT in arrays:  # the request's error, its version's last response: the request ends
            self.failed = True
            self.done = self.finals
        else:
            self.done += int(is_final(arrays))
        self.sent += 1
        return self.done >= self.finals

    def needs_final(self) -> bool:
        """After the version's responses ended: whether the client still needs an (empty) final response."""
        return not self.complete
