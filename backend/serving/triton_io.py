"""The tensorrt_llm model's tensor contract (tensorrtllm_backend's names), as plain numpy <-> engine objects.

Inputs arrive with a leading batch dim B; each batch row becomes one engine request. No Triton import here:
model_repository/tensorrt_llm/1/model.py only moves these arrays in and out of pb_utils tensors.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from backend.engine.interface import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import TopLogProbs
from backend.errors import InvalidRequestError
from backend.serving.detokenizer import CONTEXT_TOKENS
from backend.serving.stream_acks import HOLD_MAX_S, AckSlot

MAX_RETURN_SEQUENCES = 16
# Optional inputs this engine does not implement: a request that sets them gets INVALID_ARG, never a silent no-op.
_UNSUPPORTED_IF_TRUE = ("return_context_logits", "return_generation_logits")
_UNSUPPORTED_IF_PRESENT = ("embedding_bias", "prompt_embedding_table", "prompt_table_extra_ids", "prompt_vocab_size",
                           "lora_task_id", "lora_weights", "lora_config", "guided_decoding_guide_type",
                           "guided_decoding_guide", "draft_input_ids")
# Perf outputs of speculative decoding (the anchor's): always 0 here, there is no draft model.
_SPECULATIVE_PERF = {"acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32,
                     "total_draft_tokens": np.int32}


@dataclass(frozen=True)
class ParsedRow:
    """One batch row of a tensorrt_llm request, validated."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    streaming: bool
    exclude_input_in_output: bool
    batch_index: int = 0  # which row of the Triton request
    batch_size: int = 1  # its rows: batch_index is an output only when there are several (as the anchor)
    sequence_index: int = 0  # which of its num_return_sequences
    num_sequences: int = 1  # how many: sequence_index is an output only when there are several (as the anchor)
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


def parse_request(inputs: Mapping[str, np.ndarray], default_exclude_input: bool,
                  decoupled: bool = True) -> list[ParsedRow]:
    """Validate a tensorrt_llm request's tensors and split it into rows (raises InvalidRequestError).

    Not decoupled (unary inference: exactly one response per request), a request may not stream and holds one
    batch row, as in the anchor; its num_return_sequences come back together in that one response."""
    for name in _UNSUPPORTED_IF_PRESENT:
        if inputs.get(name) is not None and inputs[name].size:
            raise InvalidRequestError(f"input {name!r} is not supported by this engine")
    ids = inputs.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[1] == 0:
        raise InvalidRequestError("input_ids is required, with shape [batch, tokens] and at least one token")
    if not decoupled and ids.shape[0] > 1:
        raise InvalidRequestError(f"a request with {ids.shape[0]} batch rows needs the decoupled model "
                                  f"(this repository was rendered with decoupled_mode false): send one row per request")
    rows = []
    for b in range(ids.shape[0]):
        row = _parse_row(inputs, ids, b, default_exclude_input)
        if row.streaming and not decoupled:
            raise InvalidRequestError("streaming needs the decoupled model (this repository was rendered with "
                                      "decoupled_mode false): send stream=false, or render with --decoupled-mode true")
        rows.extend(_sequences(row, _scalar(inputs, "num_return_sequences", b, int, 1)))
    return rows


def _check_decoder_input(inputs: Mapping[str, np.ndarray], row: int, pad_id: int | None) -> None:
    """decoder_input_ids is for encoder-decoder models; this engine serves decoder-only ones. Accepted when it says
    "no decoder input": empty (our preprocessing's DECODER_INPUT_ID), or the anchor preprocessing's one pad id."""
    ids = inputs.get("decoder_input_ids")
    length = _scalar(inputs, "decoder_input_lengths", row, int)
    if ids is None or ids.size == 0:
        if length not in (None, 0):
            raise InvalidRequestError(f"decoder_input_lengths is {length} but decoder_input_ids is empty")
        return
    values = ids[row].reshape(-1)[: length if length is not None else None].tolist()
    if values and not (len(values) == 1 and pad_id is not None and values[0] == pad_id):
        raise InvalidRequestError("decoder_input_ids is for encoder-decoder models; this model is decoder-only "
                                  "(send it empty, or leave it out)")


def _min_tokens(inputs: Mapping[str, np.ndarray], row: int) -> int:
    """min_tokens, or min_length (its name in older tensorrtllm_backend ensembles; genai-perf 0.0.16 sends it)."""
    new, old = _scalar(inputs, "min_tokens", row, int), _scalar(inputs, "min_length", row, int)
    if new is not None and old is not None and new != old:
        raise InvalidRequestError(f"min_tokens ({new}) and min_length ({old}, its old name) disagree: send one")
    return next((v for v in (new, old) if v is not None), 0)


def _float(inputs: Mapping[str, np.ndarray], name: str, row: int, default: float | None) -> float | None:
    value = _scalar(inputs, name, row, float, default)
    if value is not None and not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value}")
    return value


def _sequences(row: ParsedRow, n: int) -> list[ParsedRow]:
    """num_return_sequences: n independent sequences of one prompt (seeds seed, seed + 1, ... when seeded; equal
    outputs under greedy decoding, as TensorRT-LLM). They share the prompt's KV blocks through the prefix cache."""
    if not 1 <= n <= MAX_RETURN_SEQUENCES:
        raise InvalidRequestError(f"num_return_sequences must be in [1, {MAX_RETURN_SEQUENCES}], got {n}")
    seed = row.sampling.seed
    return [dataclasses.replace(row, sequence_index=i, num_sequences=n, sampling=dataclasses.replace(
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
    top_p = _float(inputs, "runtime_top_p", row, None)
    pad_id = _scalar(inputs, "pad_id", row, int)
    _check_decoder_input(inputs, row, pad_id)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_float(inputs, "temperature", row, 1.0),
        top_k=_scalar(inputs, "runtime_top_k", row, int, 0),
        top_p=top_p if top_p is not None and top_p > 0.0 else None,  # as TensorRT-LLM: 0 or less means no limit
        seed=_scalar(inputs, "seed", row, int),
        end_id=_scalar(inputs, "end_id", row, int),
        pad_id=pad_id,
        min_tokens=_min_tokens(inputs, row),
        repetition_penalty=_float(inputs, "repetition_penalty", row, 1.0),
        presence_penalty=_float(inputs, "presence_penalty", row, 0.0),
        frequency_penalty=_float(inputs, "frequency_penalty", row, 0.0),
        length_penalty=_float(inputs, "len_penalty", row, 0.0),
        stop_words=parse_word_list(inputs.get("stop_words_list"), row, "stop_words_list"),
        bad_words=parse_word_list(inputs.get("bad_words_list"), row, "bad_words_list"),
        return_log_probs=_scalar(inputs, "return_log_probs", row, bool, False),
        num_top_log_probs=_scalar(inputs, "num_top_log_probs", row, int, 0),
    )
    return ParsedRow(
        prompt_ids=tuple(int(t) for t in ids[row, :length]),
        sampling=sampling,
        streaming=_scalar(inputs, "streaming", row, bool, False),
        exclude_input_in_output=_scalar(inputs, "exclude_input_in_output", row, bool, default_exclude_input),
        batch_index=row,
        batch_size=ids.shape[0],
        return_perf_metrics=_scalar(inputs, "return_perf_metrics", row, bool, False),
        return_num_input_tokens=_scalar(inputs, "return_num_input_tokens", row, bool, False),
        return_num_output_tokens=_scalar(inputs, "return_num_output_tokens", row, bool, False),
    )


@dataclass
class RowStream:
    """Turns one row's engine outputs into response tensors: per token when streaming, once at the end otherwise.

    Streaming, a row's response is not queued behind its own previous one: while that one has not gone out (the
    send thread is behind) or, in the ensemble, has not been taken by postprocessing (backend/serving/
    stream_acks.py), new tokens wait here and go out together in the next response, as vLLM's output collector
    merges the deltas of a slow consumer. Each response then costs one send and one postprocessing execution for
    several tokens. The text and ids a client puts together are the same (the anchor's streamed responses may hold
    several tokens too: draft tokens); only the number of responses differs. A row's last output always goes out.
    """

    row: ParsedRow
    request_key: int = 0  # the engine request's key: a later `stop` with this request_key ends it
    emitted: list[int] = field(default_factory=list)  # output_ids already sent (the stream's detokenization context)
    pending: list[int] = field(default_factory=list)  # tokens not sent yet
    pending_log_probs: list[float] = field(default_factory=list)
    pending_top: list[TopLogProbs] = field(default_factory=list)  # per pending token, with num_top_log_probs
    started: bool = False
    ack: AckSlot | None = None  # streaming: where the ensemble's postprocessing acks this row's responses
    made: int = 0  # streamed responses handed out to be sent (the engine thread counts them)
    delivered: int = 0  # ... and gone out (the send thread counts them, through sent())
    made_at: float = 0.0  # time.monotonic() of the last one
    interval: int = 1  # streaming: new tokens a response waits for, its row's first and last excepted

    def __post_init__(self) -> None:
        if not self.row.exclude_input_in_output and not self.row.streaming:
            # As TensorRT-LLM: without exclude_input_in_output a non-streamed output starts with the prompt; a
            # streamed response never holds it (the anchor's clients prepend the prompt themselves).
            self.pending.extend(self.row.prompt_ids)

    def on_output(self, out: RequestOutput) -> dict[str, np.ndarray] | None:
        """Response tensors for this engine output, or None when nothing is to be sent yet."""
        self.pending.extend(out.new_token_ids)
        self.pending_log_probs.extend(out.new_log_probs)
        self.pending_top.extend(out.new_top_log_probs)
        if not out.finished and (not self.row.streaming or not out.new_token_ids or self._behind()
                                 or 0 < self.made and len(self.pending) < self.interval):
            return None
        tensors = self._tensors(out)
        self.emitted.extend(self.pending)
        self.pending, self.pending_log_probs, self.pending_top = [], [], []
        if self.row.streaming:
            self.made += 1
            self.made_at = time.monotonic()
            if self.ack is not None:
                tensors["stream_ack"] = self.ack.stamp(self.made)
        return tensors

    def _behind(self) -> bool:
        """Whether this row's previous response is still queued: on the send thread, or in front of the ensemble's
        postprocessing (which acks what it takes; a row nobody acks is not held, nor one held HOLD_MAX_S)."""
        if self.made > self.delivered:
            return True
        if self.ack is None or self.made == 0:
            return False
        acked = self.ack.acked()
        return 0 < acked < self.made and time.monotonic() - self.made_at < HOLD_MAX_S

    def close(self) -> None:
        """The row ended (any way): its ack slot goes back."""
        if self.ack is not None:
            self.ack.release()

    def sent(self) -> None:
        """A streamed response of this row went out (or failed to): the send thread calls this."""
        self.delivered += 1

    def _tensors(self, out: RequestOutput) -> dict[str, np.ndarray]:
        row = self.row
        tokens = np.array(self.pending, dtype=np.int32).reshape(1, 1, -1)  # (batch 1, beam 1, tokens)
        tensors = {
            "output_ids": tokens,
            "sequence_length": np.array([[tokens.shape[-1]]], dtype=np.int32),
            "stream_context_ids": np.array(self.emitted[-CONTEXT_TOKENS:], dtype=np.int32).reshape(1, 1, -1),
            "stream_final": np.array([[out.finished]], dtype=bool),
            "request_key": np.array([[self.request_key]], dtype=np.uint64),
        }
        # As the anchor: batch_index only for a request of several rows, sequence_index only for several sequences.
        if row.batch_size > 1:
            tensors["batch_index"] = np.array([[row.batch_index]], dtype=np.int32)
        if row.num_sequences > 1:
            tensors["sequence_index"] = np.array([[row.sequence_index]], dtype=np.int32)
        if row.sampling.return_log_probs:
            tensors["cum_log_probs"] = np.array([[out.cum_log_prob or 0.0]], dtype=np.float32)
            tensors["output_log_probs"] = np.array(self.pending_log_probs, dtype=np.float32).reshape(1, 1, -1)
        if row.sampling.num_top_log_probs:
            tensors.update(top_log_prob_tensors(self.pending_top, row.sampling.num_top_log_probs))
        if row.return_perf_metrics and out.perf is not None:
            for name, value in dataclasses.asdict(out.perf).items():
                dtype = np.int64 if name.endswith("_time_ns") else np.int32
                tensors[name] = np.array([[value]], dtype=dtype)
            for name, dtype in _SPECULATIVE_PERF.items():
                tensors[name] = np.zeros((1, 1), dtype=dtype)
        if row.return_num_input_tokens:
            tensors["num_input_tokens"] = np.array([[out.num_input_tokens]], dtype=np.int32)
        if row.return_num_output_tokens:
            # As the anchor (TensorRT-LLM PR 5445): the tokens of this response's output_ids. Streamed: this
            # response's new tokens (a client sums them); not streamed: the total, with the prompt when it is there.
            tensors["num_output_tokens"] = np.array([[tokens.shape[-1]]], dtype=np.int32)
        return tensors


def top_log_prob_tensors(top: list[TopLogProbs], k: int) -> dict[str, np.ndarray]:
    """top_log_probs (1, tokens, k) FP32 and top_log_probs_ids (1, tokens, k) INT32, most likely first."""
    ids = np.array([[t for t, _ in entry] for entry in top], dtype=np.int32).reshape(1, len(top), k)
    lps = np.array([[lp for _, lp in entry] for entry in top], dtype=np.float32).reshape(1, len(top), k)
    return {"top_log_probs": lps, "top_log_probs_ids": ids}
