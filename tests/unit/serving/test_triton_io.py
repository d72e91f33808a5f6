"""The tensorrt_llm tensor contract: request parsing and validation, word lists, per-row response streaming."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from backend.engine.interface import PerfMetrics, RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason
from backend.errors import InvalidRequestError
from backend.serving.detokenizer import CONTEXT_TOKENS
from backend.serving import triton_io
from backend.serving.stream_acks import HOLD_MAX_S, AckBoard, AckWriter
from backend.serving.triton_io import ParsedRow, RowStream, parse_request, parse_word_list


def scalar(value, dtype=np.int32) -> np.ndarray:
    return np.array([[value]], dtype=dtype)  # (batch 1, 1), as Triton hands a [1]-dim input


def f32(value: float) -> float:
    """value as it arrives through an FP32 tensor."""
    return float(np.float32(value))


def request(**inputs) -> dict[str, np.ndarray]:
    """A one-row request: prompt [11, 12, 13], request_output_len 5, overridden or extended by `inputs`."""
    base = {"input_ids": np.array([[11, 12, 13]], dtype=np.int32), "input_lengths": scalar(3),
            "request_output_len": scalar(5)}
    return {k: v for k, v in {**base, **inputs}.items() if v is not None}


def word_list(words: list[list[int]], width: int) -> np.ndarray:
    """One row of the anchor format (1, 2, width): flat ids padded with 0, cumulative offsets padded with -1."""
    flat = [t for w in words for t in w]
    out = np.zeros((1, 2, width), dtype=np.int32)
    out[0, 1, :] = -1
    out[0, 0, : len(flat)] = flat
    out[0, 1, : len(words)] = np.cumsum([len(w) for w in words])
    return out


def test_parse_request_happy_path():
    inputs = request(
        input_ids=np.array([[11, 12, 13, 0], [21, 22, 23, 24]], dtype=np.int32),
        input_lengths=np.array([3, 4], dtype=np.int32),  # reshape: [] in config.pbtxt: (B,) not (B, 1)
        request_output_len=np.array([5, 6], dtype=np.int32),
        temperature=np.array([0.5, 1.0], dtype=np.float32), runtime_top_k=np.array([40, 1], dtype=np.int32),
        runtime_top_p=np.array([0.9, 1.0], dtype=np.float32), seed=np.array([2**64 - 1, 3], dtype=np.uint64),
        end_id=np.array([2, 2], dtype=np.int32), min_tokens=np.array([1, 0], dtype=np.int32),
        repetition_penalty=np.array([1.1, 1.0], dtype=np.float32), streaming=np.array([True, False]),
        exclude_input_in_output=np.array([False, True]), return_log_probs=np.array([True, False]),
        stop_words_list=np.concatenate([word_list([[5, 6], [7]], 4), word_list([[8]], 4)]),
    )
    first, second = parse_request(inputs, default_exclude_input=True)
    assert first.prompt_ids == (11, 12, 13) and second.prompt_ids == (21, 22, 23, 24)
    assert first.sampling == SamplingParams(
        max_tokens=5, temperature=0.5, top_k=40, top_p=f32(0.9), seed=2**64 - 1, end_id=2, min_tokens=1,
        repetition_penalty=f32(1.1), stop_words=((5, 6), (7,)), return_log_probs=True)
    assert (first.streaming, first.exclude_input_in_output) == (True, False)
    assert second.sampling.top_p == 1.0 and second.sampling.greedy  # top_k 1: greedy whatever top_p says
    assert second.sampling.stop_words == ((8,),)
    assert (second.streaming, second.exclude_input_in_output) == (False, True)


def test_defaults_when_optional_inputs_are_absent():
    (row,) = parse_request(request(), default_exclude_input=False)
    assert row.sampling == SamplingParams(max_tokens=5)
    assert row.sampling.greedy and not row.streaming and not row.exclude_input_in_output


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"request_output_len": None}, "request_output_len .* is required"),
        ({"input_ids": None}, "input_ids is required"),
        ({"input_ids": np.zeros((1, 0), dtype=np.int32)}, "input_ids is required"),
        ({"beam_width": scalar(2)}, "beam_width must be 1"),
        ({"num_return_sequences": scalar(0)}, r"num_return_sequences must be in \[1, 16\], got 0"),
        ({"num_return_sequences": scalar(17)}, r"num_return_sequences must be in \[1, 16\], got 17"),
        ({"return_context_logits": scalar(True, bool)}, "return_context_logits is not supported"),
        ({"return_generation_logits": scalar(True, bool)}, "return_generation_logits is not supported"),
        ({"embedding_bias": np.ones((1, 4), dtype=np.float32)}, "'embedding_bias' is not supported"),
        ({"runtime_top_p": scalar(1.5, np.float32)}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"runtime_top_p": scalar(float("nan"), np.float32)}, "runtime_top_p must be a finite number"),
        ({"presence_penalty": scalar(float("inf"), np.float32)}, "presence_penalty must be a finite number"),
        ({"frequency_penalty": scalar(-float("inf"), np.float32)}, "frequency_penalty must be a finite number"),
        ({"min_tokens": scalar(3), "min_length": scalar(4)}, r"min_tokens \(3\) and min_length \(4"),
        ({"decoder_input_ids": np.array([[7, 8]], dtype=np.int32)}, "decoder_input_ids is for encoder-decoder"),
        ({"decoder_input_ids": np.array([[7]], dtype=np.int32), "pad_id": scalar(2)}, "decoder-only"),
        ({"decoder_input_lengths": scalar(2)}, "decoder_input_lengths is 2 but decoder_input_ids is empty"),
        ({"prompt_embedding_table": np.ones((1, 2, 4), dtype=np.float16)}, "'prompt_embedding_table' is not supp"),
        ({"prompt_vocab_size": scalar(4)}, "'prompt_vocab_size' is not supported"),
        ({"prompt_table_extra_ids": np.ones((1, 3), dtype=np.uint64)}, "'prompt_table_extra_ids' is not supported"),
        ({"stop_words_list": word_list([[5]] * 1025, 1025)}, r"stop_words holds 1025 token ids, more than the limit"),
        ({"temperature": scalar(-1.0, np.float32)}, "temperature must be >= 0"),
        ({"request_output_len": scalar(0)}, "max_tokens must be > 0"),
        ({"len_penalty": scalar(-0.5, np.float32)}, "length_penalty must be >= 0"),
        ({"input_lengths": scalar(4)}, r"input_lengths \(4\) must be in \[1, 3\]"),
        ({"input_lengths": scalar(0)}, r"input_lengths \(0\) must be in \[1, 3\]"),
        ({"temperature": np.array([[1.0, 0.5]], dtype=np.float32)}, "one value per batch row"),
        ({"bad_words_list": np.array([[[5, 6, 0], [2, 1, -1]]])}, "bad_words_list has an invalid offset 1"),  # decreasing
        ({"bad_words_list": np.array([[[5, 6, 0], [2, 4, -1]]])}, "bad_words_list has an invalid offset 4"),  # past N
        ({"stop_words_list": np.array([[[5, 6], [0, -1]]], dtype=np.int32)}, "stop_words_list has an invalid offset 0"),
        ({"stop_words_list": np.array([[5, 6, 2, -1]], dtype=np.int32)}, r"must have shape \[batch, 2, N\]"),
    ],
)
def test_invalid_requests_name_the_input(inputs, message):
    with pytest.raises(InvalidRequestError, match=message):
        parse_request(request(**inputs), default_exclude_input=True)


def test_word_list_anchor_format():
    arr = np.array([[[5, 6, 7, 9, 0, 0], [2, 3, 4, -1, -1, -1]], [[8, 0, 0, 0, 0, 0], [1, -1, -1, -1, -1, -1]]],
                   dtype=np.int32)
    assert parse_word_list(arr, 0, "bad_words_list") == ((5, 6), (7,), (9,))
    assert parse_word_list(arr, 1, "bad_words_list") == ((8,),)
    assert parse_word_list(None, 0, "bad_words_list") == ()
    assert parse_word_list(np.zeros((1, 2, 0), dtype=np.int32), 0, "bad_words_list") == ()
    assert parse_word_list(word_list([], 1), 0, "bad_words_list") == ()  # a row without words: offsets all -1


# --- RowStream ----------------------------------------------------------------------------------------------

PROMPT = (11, 12, 13)


def stream(streaming: bool, exclude_input: bool = True, interval: int = 1, **sampling) -> RowStream:
    row = ParsedRow(PROMPT, SamplingParams(max_tokens=20, **sampling), streaming=streaming,
                    exclude_input_in_output=exclude_input, return_num_input_tokens=True, return_num_output_tokens=True)
    return RowStream(dataclasses.replace(row, batch_index=3, batch_size=4), interval=interval)


def outputs(tokens: list[int], log_probs: list[float] | None = None) -> list[RequestOutput]:
    """The engine's outputs for a request that generates `tokens`, one a step, until max_tokens."""
    last = len(tokens) - 1
    return [RequestOutput("r", [t], [log_probs[i]] if log_probs else [], i == last,
                          FinishReason.LENGTH if i == last else None, len(PROMPT), i + 1,
                          sum(log_probs[: i + 1]) if log_probs else None)
            for i, t in enumerate(tokens)]


PERF = PerfMetrics(kv_cache_alloc_new_blocks=1, kv_cache_reused_blocks=0, kv_cache_alloc_total_blocks=1,
                   arrival_time_ns=5, first_scheduled_time_ns=6, first_token_time_ns=7, last_token_time_ns=8)


def responses(rs: RowStream, outs: list[RequestOutput]) -> list[dict[str, np.ndarray]]:
    """What the row sends when each response goes out before the next output (the send thread keeps up)."""
    sent = []
    for o in outs:
        if (t := rs.on_output(o)) is not None:
            sent.append(t)
            rs.sent()
    return sent


def test_streaming_emits_each_token_with_the_ids_sent_before_it():
    tokens = list(range(100, 112))
    sent = responses(stream(streaming=True), outputs(tokens))
    assert [r["output_ids"].tolist() for r in sent] == [[[[t]]] for t in tokens]
    for i, r in enumerate(sent):
        assert r["stream_context_ids"].tolist() == [[tokens[:i][-CONTEXT_TOKENS:]]]
        assert r["sequence_length"].tolist() == [[1]]
        assert r["stream_final"].tolist() == [[i == len(tokens) - 1]]
        assert r["batch_index"].tolist() == [[3]] and "sequence_index" not in r  # one sequence: as the anchor
        # Each streamed response counts its own tokens (TensorRT-LLM PR 5445): a client sums them.
        assert r["num_input_tokens"].tolist() == [[3]] and r["num_output_tokens"].tolist() == [[1]]


def test_a_streamed_row_behind_its_sends_merges_tokens_until_its_last_response_went_out():
    rs = stream(streaming=True, return_log_probs=True)
    tokens, lps = [100, 101, 102, 103, 104, 105], [-0.5, -1.0, -1.5, -2.0, -2.5, -3.0]
    outs = outputs(tokens, lps)
    first = rs.on_output(outs[0])  # nothing queued: out at once
    assert first["output_ids"].tolist() == [[[100]]]
    assert rs.on_output(outs[1]) is None and rs.on_output(outs[2]) is None  # the first has not gone out yet
    rs.sent()
    merged = rs.on_output(outs[3])
    assert merged["output_ids"].tolist() == [[[101, 102, 103]]] and merged["sequence_length"].tolist() == [[3]]
    assert merged["num_output_tokens"].tolist() == [[3]] and merged["stream_context_ids"].tolist() == [[[100]]]
    assert merged["output_log_probs"].tolist() == [[[-1.0, -1.5, -2.0]]]
    assert merged["cum_log_probs"].tolist() == [[-5.0]] and merged["stream_final"].tolist() == [[False]]
    assert rs.on_output(outs[4]) is None  # the merged one is still queued
    final = rs.on_output(outs[5])  # a row's last output goes out whatever is queued: nothing is left behind
    assert final["output_ids"].tolist() == [[[104, 105]]] and final["stream_final"].tolist() == [[True]]
    assert final["stream_context_ids"].tolist() == [[[100, 101, 102, 103]]]


@pytest.mark.parametrize("interval, sizes", [(1, [1] * 8), (3, [1, 3, 3, 1]), (4, [1, 4, 3]), (8, [1, 7]),
                                             (20, [1, 7])])
def test_stream_interval_sends_that_many_tokens_a_response_but_the_first_and_the_last(interval, sizes):
    """vLLM's --stream-interval: the first token goes out at once (time to first token), later responses wait for
    `interval` new tokens, and the row's last output goes out with whatever is left."""
    tokens, lps = list(range(100, 108)), [-0.25 * (i + 1) for i in range(8)]
    sent = responses(stream(streaming=True, interval=interval, return_log_probs=True), outputs(tokens, lps))
    assert [r["output_ids"].shape[-1] for r in sent] == sizes
    assert [t for r in sent for t in r["output_ids"].reshape(-1).tolist()] == tokens
    assert [p for r in sent for p in r["output_log_probs"].reshape(-1).tolist()] == lps
    assert [r["num_output_tokens"].tolist() for r in sent] == [[[n]] for n in sizes]
    assert [r["stream_final"].tolist() for r in sent] == [[[False]]] * (len(sizes) - 1) + [[[True]]]


def test_stream_interval_does_not_hold_a_non_streamed_row():
    sent = responses(stream(streaming=False, interval=4), outputs([100, 101, 102]))
    assert [r["output_ids"].tolist() for r in sent] == [[[[100, 101, 102]]]]


def test_a_streamed_row_acked_by_postprocessing_waits_for_the_ack_of_its_last_response(tmp_path, monkeypatch):
    board = AckBoard(slots=2, directory=tmp_path)
    rs, writer = stream(streaming=True), AckWriter(tmp_path)
    rs.ack = board.lease()
    outs = outputs(list(range(100, 108)))

    def out(i):
        t = rs.on_output(outs[i])
        if t is not None:
            rs.sent()  # the send thread keeps up: only postprocessing is behind
        return t

    first, second = out(0), out(1)  # nothing acked yet: not held (a direct client never acks)
    assert first["stream_ack"].tolist() == [[board.key, rs.ack.slot, (rs.ack.generation << 32) | 1]]
    writer.ack(first["stream_ack"])  # acks on: response 2 not taken yet, so the next tokens wait
    assert second["output_ids"].tolist() == [[[101]]] and out(2) is None and out(3) is None
    writer.ack(second["stream_ack"])
    merged = out(4)
    assert merged["output_ids"].tolist() == [[[102, 103, 104]]] and merged["stream_ack"].tolist()[0][2] & 0xFFFF == 3
    assert out(5) is None
    now = time.monotonic()  # postprocessing stops acking: a row waits HOLD_MAX_S at most
    monkeypatch.setattr(triton_io.time, "monotonic", lambda: now + HOLD_MAX_S)
    assert out(6)["output_ids"].tolist() == [[[105, 106]]]
    rs.close()
    board.close()


def test_non_streaming_emits_once_at_the_end():
    rs = stream(streaming=False)
    outs = outputs([100, 101, 102])
    assert [rs.on_output(o) for o in outs[:-1]] == [None, None]
    final = rs.on_output(outs[-1])
    assert final["output_ids"].tolist() == [[[100, 101, 102]]] and final["sequence_length"].tolist() == [[3]]
    assert final["stream_final"].tolist() == [[True]] and final["stream_context_ids"].shape == (1, 1, 0)


def test_without_exclude_input_a_non_streamed_output_starts_with_the_prompt():
    (sent,) = responses(stream(streaming=False, exclude_input=False), outputs([100, 101]))
    assert sent["output_ids"].reshape(-1).tolist() == [*PROMPT, 100, 101]
    assert sent["num_output_tokens"].tolist() == [[5]]  # as the anchor: the tokens of output_ids, prompt included


def test_a_streamed_output_never_holds_the_prompt():
    """As the anchor: its streaming clients prepend the prompt themselves."""
    sent = responses(stream(streaming=True, exclude_input=False), outputs([100, 101]))
    assert [r["output_ids"].reshape(-1).tolist() for r in sent] == [[100], [101]]


def test_one_row_request_has_no_batch_index_and_perf_has_the_speculative_outputs():
    row = ParsedRow(PROMPT, SamplingParams(max_tokens=2), streaming=False, exclude_input_in_output=True,
                    return_perf_metrics=True)
    (sent,) = responses(RowStream(row), [dataclasses.replace(o, perf=PERF) for o in outputs([100, 101])])
    assert "batch_index" not in sent and "sequence_index" not in sent
    assert sent["acceptance_rate"].dtype == np.float32 and sent["acceptance_rate"].tolist() == [[0.0]]
    assert sent["total_draft_tokens"].tolist() == [[0]] and sent["total_accepted_draft_tokens"].tolist() == [[0]]
    assert sent["arrival_time_ns"].dtype == np.int64 and sent["kv_cache_reused_blocks"].dtype == np.int32


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_top_p_zero_or_less_means_no_top_p_limit(value):
    (row,) = parse_request(request(runtime_top_p=scalar(value, np.float32), runtime_top_k=scalar(1)), True)
    assert row.sampling.top_p is None and row.sampling.greedy


def test_min_length_is_min_tokens_old_name():
    (row,) = parse_request(request(min_length=scalar(7)), True)
    assert row.sampling.min_tokens == 7


@pytest.mark.parametrize("ids", [np.zeros((1, 0), dtype=np.int32), np.array([[2]], dtype=np.int32)])
def test_decoder_inputs_meaning_none_are_accepted(ids):
    """Our preprocessing's empty DECODER_INPUT_ID, and the anchor preprocessing's one pad id."""
    (row,) = parse_request(request(decoder_input_ids=ids, pad_id=scalar(2)), True)
    assert row.prompt_ids == (11, 12, 13)


def test_unary_refuses_streaming_and_several_rows():
    with pytest.raises(InvalidRequestError, match="streaming needs the decoupled model"):
        parse_request(request(streaming=scalar(True, bool)), True, decoupled=False)
    two = request(input_ids=np.array([[1], [2]], dtype=np.int32), input_lengths=np.array([1, 1], dtype=np.int32),
                  request_output_len=np.array([2, 2], dtype=np.int32))
    with pytest.raises(InvalidRequestError, match="2 batch rows needs the decoupled model"):
        parse_request(two, True, decoupled=False)


def test_end_id_finish_sends_a_final_empty_response():
    rs = stream(streaming=True, end_id=2)
    sent = responses(rs, [RequestOutput("r", [100], [], False, None, 3, 1),
                          RequestOutput("r", [], [], True, FinishReason.END_ID, 3, 1)])  # end_id is not output
    assert [r["output_ids"].tolist() for r in sent] == [[[[100]]], [[[]]]]
    assert sent[-1]["stream_final"].tolist() == [[True]] and sent[-1]["sequence_length"].tolist() == [[0]]
    assert sent[-1]["stream_context_ids"].tolist() == [[[100]]]


def test_log_probs_are_returned_when_asked():
    sent = responses(stream(streaming=False, return_log_probs=True), outputs([100, 101], log_probs=[-0.5, -1.5]))
    (final,) = sent
    assert final["output_log_probs"].tolist() == [[[-0.5, -1.5]]]
    assert final["cum_log_probs"].tolist() == [[-2.0]]
    assert "cum_log_probs" not in responses(stream(streaming=False), outputs([100]))[0]


def test_num_return_sequences_expands_rows_with_seeds_and_indices():
    inputs = request(input_ids=np.array([[5, 6, 7]], dtype=np.int32), request_output_len=scalar(4),
                     num_return_sequences=scalar(3), seed=np.array([[10]], dtype=np.uint64),
                     runtime_top_k=scalar(20))
    rows = parse_request(inputs, default_exclude_input=True)
    assert [(r.batch_index, r.sequence_index, r.sampling.seed) for r in rows] == [(0, 0, 10), (0, 1, 11), (0, 2, 12)]
    assert all(r.prompt_ids == (5, 6, 7) for r in rows)


def test_top_log_probs_are_sent_per_token_when_asked():
    rs = stream(streaming=False, num_top_log_probs=2)
    outs = [dataclasses.replace(o, new_top_log_probs=[((100 + i, -0.1), (5, -2.5))])
            for i, o in enumerate(outputs([100, 101]))]
    (final,) = responses(rs, outs)
    assert final["top_log_probs_ids"].tolist() == [[[100, 5], [101, 5]]]
    assert final["top_log_probs"].reshape(-1).tolist() == pytest.approx([-0.1, -2.5, -0.1, -2.5])
    assert "top_log_probs" not in responses(stream(streaming=False), outputs([100]))[0]


def test_num_top_log_probs_input_reaches_the_sampling_params():
    (row,) = parse_request({"input_ids": np.array([[1, 2]], dtype=np.int32),
                            "request_output_len": np.array([[4]], dtype=np.int32),
                            "num_top_log_probs": np.array([[5]], dtype=np.int32)}, True)
    assert row.sampling.num_top_log_probs == 5
