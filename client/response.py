"""What a generation yields: text chunks, plus the optional extras the request asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

# Reads one output of a response by name; None when the response lacks it.
# tritonclient's `InferResult.as_numpy` and `dict.get` on a generate-endpoint JSON body both fit.
OutputGetter = Callable[[str], Any]


@dataclass(frozen=True)
class TextChunk:
    """One piece of generated text. Streamed chunks concatenate to the non-streamed text.

    The extras are set only when the request asked for them (return_log_probs,
    return_num_input_tokens, return_num_output_tokens) and the response carries them.
    """

    text: str
    cum_log_probs: float | None = None
    output_log_probs: list[float] | None = None  # one per token generated in this chunk
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None  # tokens in this chunk (streamed: sum them for the total)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"text must be str, got {type(self.text).__name__}")


def chunk_from_outputs(get: OutputGetter, output_names: list[str]) -> TextChunk | None:
    """Build the chunk of one response, reading only `output_names` (see
    `GenerationRequest.output_names`). None when the response carries no text_output
    (Triton's empty final response). Beam / sequence 0 is taken where there are several."""
    text = get("text_output")
    if text is None:
        return None
    wanted = set(output_names)

    def extra(name: str) -> np.ndarray | None:
        value = get(name) if name in wanted else None
        return None if value is None else np.asarray(value).reshape(-1)

    log_probs = extra("output_log_probs")
    return TextChunk(
        text=_as_text(np.asarray(text).reshape(-1)),
        cum_log_probs=_first(extra("cum_log_probs"), float),
        output_log_probs=None if log_probs is None else [float(x) for x in log_probs],
        num_input_tokens=_first(extra("num_input_tokens"), int),
        num_output_tokens=_first(extra("num_output_tokens"), int),
    )


def _as_text(values: np.ndarray) -> str:
    if values.size == 0:
        return ""
    first = values[0]
    # BYTES outputs arrive as bytes over gRPC and as str in the generate endpoint's JSON.
    return first.decode("utf-8", errors="replace") if isinstance(first, bytes) else str(first)


def _first(values: np.ndarray | None, cast: Callable[[Any], Any]) -> Any:
    return None if values is None or values.size == 0 else cast(values[0])
