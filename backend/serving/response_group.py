"""How the rows of one Triton request share its one response sender, decoupled or not (no Triton import).

A Triton request becomes several engine requests (rows: batch rows x num_return_sequences). Each row's outputs
arrive here from the engine thread:
- decoupled: every response is sent as it comes; the one that ends the last row carries Triton's FINAL flag
  (an empty final is sent when that row has nothing left to say);
- not decoupled (unary inference: exactly one response per request): the rows' final tensors are held and sent
  together as one response when the last row ends, its sequences stacked along the beam axis, as the anchor
  returns beams: output_ids [1, n, T] (shorter ones padded), sequence_length [1, n]; postprocessing then yields
  text_output [n].
Either way the first error is the request's final response, as one TensorRT-LLM response ends a request; the other
rows are then cancelled and what they still say is dropped. (In the ensemble an error has to be the last response of
the stream: backend/serving/stream_errors.py.)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

Tensors = dict[str, np.ndarray]


# The pb_utils.TritonError codes a row's error may carry (Triton's names).
ROW_ERROR_CODES = ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL")


@dataclass(frozen=True)
class RowError:
    message: str
    code: str = "INTERNAL"  # one of ROW_ERROR_CODES

    def __post_init__(self) -> None:
        # checked where the error is made: a code no sender knows would fail the send of the request's last
        # response (stream_errors.error_tensors, pb_utils.TritonError), leaving its client waiting
        if self.code not in ROW_ERROR_CODES:
            raise ValueError(f"RowError code must be one of {', '.join(ROW_ERROR_CODES)}, got {self.code!r}")


# send(response, final, on_sent): response is Tensors, a RowError, or None (a flag-only final, decoupled only);
# on_sent (or None) is called once the response has gone out, or its send failed.
Send = Callable[["Tensors | RowError | None", bool, "Callable[[], None] | None"], None]

# Outputs that sum over the stacked sequences; other [1, 1] outputs are the first sequence's.
_SUMMED = ("num_output_tokens", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")
_PER_SEQUENCE = ("cum_log_probs", "sequence_length")  # [1, 1] each -> [1, n]
_PADDED = ("output_ids", "output_log_probs", "stream_context_ids")  # [1, 1, T] each -> [1, n, T_max]


class ResponseGroup:
    def __init__(self, rows: int, decoupled: bool, send: Send, on_done: Callable[[], None],
                 pad_id: int = -1) -> None:
        self.remaining = rows
        self.decoupled = decoupled
        self._send = send
        self.on_done = on_done
        self.pad_id = pad_id  # fills output_ids of shorter sequences in a unary response
        self.held: list[Tensors] = []  # unary: each row's final tensors, in the order rows finished
        self.failed = False  # an error was sent (the request's final response); the other rows are to be cancelled
        self.abandoned = False  # a send failed (the client is gone): every row is to be cancelled
        self.lock = threading.Lock()

    def send(self, response: Tensors | RowError | None, row_done: bool,
             on_sent: Callable[[], None] | None = None) -> None:
        """on_sent: decoupled, called once this response has gone out (RowStream merges tokens until then), or at
        once when the response is dropped."""
        dropped = None
        with self.lock:
            if self.remaining == 0:
                return
            if row_done:
                self.remaining -= 1
            last = self.remaining == 0
            if isinstance(response, RowError):
                if not self.failed:
                    self.failed = True
                    self._send(response, True, None)
            elif self.failed:  # the request already ended with its error: this row is being cancelled
                dropped = on_sent if response is not None else None
            elif self.decoupled:
                if response is not None or last:
                    self._send(response, last, on_sent)
            elif response is not None:
                self.held.append(response)
            if not self.decoupled and last and not self.failed:
                self._send(stack_sequences(self.held, self.pad_id), True, None)
        if dropped is not None:
            dropped()
        if last:
            self.on_done()

    def abandon(self) -> None:
        """A send failed: nothing more can reach this client (sends run on another thread, so the engine loop
        learns it here, through its sinks' cancelled())."""
        self.abandoned = True


def stack_sequences(responses: list[Tensors], pad_id: int = -1) -> Tensors:
    """One unary response from the final tensors of a request's sequences (one row each), by sequence_index."""
    if len(responses) == 1:
        return responses[0]
    responses = sorted(responses, key=lambda r: int(r.get("sequence_index", np.zeros(1)).reshape(-1)[0]))
    out: Tensors = {}
    for name, first in responses[0].items():
        values = [r[name] for r in responses if name in r]
        if name == "sequence_index":
            continue  # the sequences are the beam axis now
        if name in _PADDED:
            out[name] = _pad_stack(values, pad_id if name == "output_ids" else 0)
        elif name in _PER_SEQUENCE:
            out[name] = np.concatenate([v.reshape(1, 1) for v in values], axis=1).astype(first.dtype)
        elif name in _SUMMED:
            out[name] = np.array([[sum(int(v.reshape(-1)[0]) for v in values)]], dtype=first.dtype)
        else:
            out[name] = first
    return out


def _pad_stack(values: list[np.ndarray], fill) -> np.ndarray:
    """[1, 1, T_i] each -> [1, n, max T_i], the shorter ones filled with `fill`."""
    width = max(v.shape[-1] for v in values)
    out = np.full((1, len(values), width), fill, dtype=values[0].dtype)
    for i, v in enumerate(values):
        out[0, i, : v.shape[-1]] = v.reshape(-1)
    return out
