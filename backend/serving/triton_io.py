"""The tensorrt_llm model's tensor contract (tensorrtllm_backend's names), as plain numpy <-> engine objects.

Inputs arrive with a leading batch dim B; each batch row becomes one engine request. No Triton import here:
model_repository/tensorrt_llm/1/model.py only moves these arrays in and out of pb_utils tensors.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from backend.engine.interface import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.errors import InvalidRequestError
from backend.serving.detokenizer import CONTEXT_TOKENS

MAX_RETURN_SEQUENCES = 16
# Optional inputs this engine does not implement: a request that sets them gets INVALID_ARG, never a silent no-op.
_UNSUPPORTED_IF_TRUE = ("return_context_logits", "return_generation_logits")
_UNSUPPORTED_IF_PRESENT = ("embedding_bias", "prompt_embedding_table", "lora_task_id", "lora_weights", "lora_config",
                           "guided_decoding_guide_type", "guided_decoding_guide", "draft_input_ids")


@dataclass(frozen=True)
class ParsedRow:
    """One batch row of a tensorrt_llm request, validated."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    streaming: bool
    exclude_input_in_output: bool
    batch_index: int = 0  # which row of the Triton request
    sequence_index: int = 0  # which of its num_return_sequences
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False


def _scalar(inputs: Mapping[str, np.ndarray], name: str, row: int, cast, default=None):
    arr = inputs.get(name)
    if arr is None or arr.size == 0:
        return default
    if arr.shape[0] <= row:
        raise InvalidRequestError(f"input {name!r} has batch size {arr.shape[0]}, the request has more rows")
    flat = arr[row].reshape(-1)
    if flat.size != 1:
        raise InvalidRequestError(f"input {name!r} must hold one value per batch row, got shape {list(arr.shape)}")
    return cast(flat[0])


def parse_word_list(arr: np.ndarray | None, row: int, name: str) -> tuple[tuple[int, ...], ...]:
    """Anchor word-list format (B, 2, N): row 0 flat ids padded with 0, row 1 cumulative end offsets padded with -1."""
    if arr is None or arr.size == 0:
        return ()
    if arr.ndim != 3 or arr.shape[1] != 2:
        raise InvalidRequestError(f"{name} must have shape [batch, 2, N], got {list(arr.shape)}")
    ids, offsets = arr[row, 0], arr[row, 1]
    words, start = [], 0
    for end in offsets:
        end = int(end)
        if end < 0:
            break
        if end <= start or end > ids.shape[0]:
            raise InvalidRequestError(f"{name} has an invalid offset {end} (previous {start}, {ids.shape[0]} ids)")
        words.append(tuple(int(t) for t in ids[start:end]))
        start = end
    return tuple(words)


def parse_request(inputs: Mapping[str, np.ndarray], default_exclude_input: bool) -> list[ParsedRow]:
    """Validate a tensorrt_llm request's tensors and split it into rows (raises InvalidRequestError)."""
    for name in _UNSUPPORTED_IF_PRESENT:
        if inputs.get(name) is not None and inputs[name].size:
            raise InvalidRequestError(f"input {name!r} is not supported by this engine")
    ids = inputs.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[1] == 0:
        raise InvalidRequestError("input_ids is required, with shape [batch, tokens] and at least one token")
    rows = []
    for b in range(ids.shape[0]):
        row = _parse_row(inputs, ids, b, default_exclude_input)
        rows.extend(_sequences(row, _scalar(inputs, "num_return_sequences", b, int, 1)))
    return rows


def _sequences(row: ParsedRow, n: int) -> list[ParsedRow]:
    """num_return_sequences: n independent sequences of one prompt (seeds seed, seed + 1, ... when seeded; equal
    outputs under greedy decoding, as TensorRT-LLM). They share the prompt's KV blocks through the prefix cache."""
    if not 1 <= n <= MAX_RETURN_SEQUENCES:
        raise InvalidRequestError(f"num_return_sequences must be in [1, {MAX_RETURN_SEQUENCES}], got {n}")
    seed = row.sampling.seed
    return [dataclasses.replace(row, sequence_index=i, sampling=dataclasses.replace(
        row.sampling, seed=None if seed is None else (seed + i) % 2**64)) for i in range(n)]


def _parse_row(inputs: Mapping[str, np.ndarray], ids: np.ndarray, row: int, default_exclude_input: bool) -> ParsedRow:
    length = _scalar(inputs, "input_lengths", row, int, ids.shape[1])
    if not 0 < length <= ids.shape[1]:
        raise InvalidRequestError(f"input_lengths ({length}) must be in [1, {ids.shape[1]}] (the input_ids width)")
    max_tokens = _scalar(inputs, "request_output_len", row, int)
    if max_tokens is None:
        raise InvalidRequestError("request_output_len (max_tokens) is required")
    for name in _UNSUPPORTED_IF_TRUE:
        if _scalar(inputs, name, row, bool, False):
            raise InvalidRequestError(f"{name} is not supported by this engine")
    beam_width = _scalar(inputs, "beam_width", row, int, 1)
    if beam_width != 1:
        raise InvalidRequestError(f"beam_width must be 1 (beam search is not supported; use num_return_sequences "
                                  f"with sampling for several outputs), got {beam_width}")
    seed = _scalar(inputs, "seed", row, int)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_scalar(inputs, "temperature", row, float, 1.0),
        top_k=_scalar(inputs, "runtime_top_k", row, int, 0),
        top_p=_scalar(inputs, "runtime_top_p", row, float),  # 0 is refused: leave top_p out for no nucleus limit
        seed=seed,
        end_id=_scalar(inputs, "end_id", row, int),
        min_tokens=_scalar(inputs, "min_tokens", row, int, 0),
        repetition_penalty=_scalar(inputs, "repetition_penalty", row, float, 1.0),
        presence_penalty=_scalar(inputs, "presence_penalty", row, float, 0.0),
        frequency_penalty=_scalar(inputs, "frequency_penalty", row, float, 0.0),
        stop_words=parse_word_list(inputs.get("stop_words_list"), row, "stop_words_list"),
        bad_words=parse_word_list(inputs.get("bad_words_list"), row, "bad_words_list"),
        return_log_probs=_scalar(inputs, "return_log_probs", row, bool, False),
    )
    len_penalty = _scalar(inputs, "len_penalty", row, float, 1.0)
    if len_penalty != 1.0:
        raise InvalidRequestError(f"len_penalty applies to beam search only (beam_width 1 here), got {len_penalty}")
    return ParsedRow(
        prompt_ids=tuple(int(t) for t in ids[row, :length]),
        sampling=sampling,
        streaming=_scalar(inputs, "streaming", row, bool, False),
        exclude_input_in_output=_scalar(inputs, "exclude_input_in_output", row, bool, default_exclude_input),
        batch_index=row,
        return_perf_metrics=_scalar(inputs, "return_perf_metrics", row, bool, False),
        return_num_input_tokens=_scalar(inputs, "return_num_input_tokens", row, bool, False),
        return_num_output_tokens=_scalar(inputs, "return_num_output_tokens", row, bool, False),
    )


@dataclass
class RowStream:
    """Turns one row's engine outputs into response tensors: per token when streaming, once at the end otherwise."""

    row: ParsedRow
    request_key: int = 0  # the engine request's key: a later `stop` with this request_key ends it
    emitted: list[int] = field(default_factory=list)  # output_ids already sent (the stream's detokenization context)
    pending: list[int] = field(default_factory=list)  # tokens not sent yet
    pending_log_probs: list[float] = field(default_factory=list)
    started: bool = False

    def __post_init__(self) -> None:
        if not self.row.exclude_input_in_output:
            # As TensorRT-LLM: without exclude_input_in_output the output starts with the prompt.
            self.pending.extend(self.row.prompt_ids)

    def on_output(self, out: RequestOutput) -> dict[str, np.ndarray] | None:
        """Response tensors for this engine output, or None when nothing is to be sent yet."""
        self.pending.extend(out.new_token_ids)
        self.pending_log_probs.extend(out.new_log_probs)
        if not out.finished and (not self.row.streaming or not out.new_token_ids):
            return None
        tensors = self._tensors(out)
        self.emitted.extend(self.pending)
        self.pending, self.pending_log_probs = [], []
        return tensors

    def _tensors(self, out: RequestOutput) -> dict[str, np.ndarray]:
        row = self.row
        tokens = np.array(self.pending, dtype=np.int32).reshape(1, 1, -1)  # (batch 1, beam 1, tokens)
        tensors = {
            "output_ids": tokens,
            "sequence_length": np.array([[tokens.shape[-1]]], dtype=np.int32),
            "batch_index": np.array([[row.batch_index]], dtype=np.int32),
            "sequence_index": np.array([[row.sequence_index]], dtype=np.int32),
            "stream_context_ids": np.array(self.emitted[-CONTEXT_TOKENS:], dtype=np.int32).reshape(1, 1, -1),
            "stream_final": np.array([[out.finished]], dtype=bool),
            "request_key": np.array([[self.request_key]], dtype=np.uint64),
        }
        if row.sampling.return_log_probs:
            tensors["cum_log_probs"] = np.array([[out.cum_log_prob or 0.0]], dtype=np.float32)
            tensors["output_log_probs"] = np.array(self.pending_log_probs, dtype=np.float32).reshape(1, 1, -1)
        if row.return_perf_metrics and out.perf is not None:
            for name, value in dataclasses.asdict(out.perf).items():
                dtype = np.int64 if name.endswith("_time_ns") else np.int32
                tensors[name] = np.array([[value]], dtype=dtype)
        if row.return_num_input_tokens:
            tensors["num_input_tokens"] = np.array([[out.num_input_tokens]], dtype=np.int32)
        if row.return_num_output_tokens:
            tensors["num_output_tokens"] = np.array([[out.num_output_tokens]], dtype=np.int32)
        return tensors
