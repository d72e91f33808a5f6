"""ResponseGroup: the rows of one Triton request over one response sender, decoupled (stream) or unary (one
response holding every sequence, stacked as beams)."""
from __future__ import annotations

import numpy as np

from backend.serving.response_group import ResponseGroup, RowError, stack_sequences


def _row(tokens: list[int], index: int, **extra) -> dict[str, np.ndarray]:
    return {"output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
            "sequence_index": np.array([[index]], dtype=np.int32),
            "stream_final": np.array([[True]]), "request_key": np.array([[9]], dtype=np.uint64), **extra}


class Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[object, bool]] = []
        self.on_sent: list[object] = []
        self.done = 0

    def send(self, response, final: bool, on_sent=None) -> None:
        self.sent.append((response, final))
        self.on_sent.append(on_sent)

    def on_done(self) -> None:
        self.done += 1


def test_decoupled_forwards_each_response_and_flags_the_last():
    s = Sender()
    group = ResponseGroup(2, decoupled=True, send=s.send, on_done=s.on_done)
    group.send(_row([1], 0), row_done=False, on_sent=print)  # the row learns when its response went out
    group.send(None, row_done=False)  # nothing to say yet: nothing sent
    group.send(_row([2], 1), row_done=True)
    group.send(None, row_done=True)  # the last row ends with nothing left: a flag-only final
    assert [final for _, final in s.sent] == [False, False, True] and s.sent[-1][0] is None
    assert s.on_sent == [print, None, None]
    assert s.done == 1


def test_unary_sends_one_response_with_the_sequences_stacked_as_beams():
    s = Sender()
    group = ResponseGroup(3, decoupled=False, send=s.send, on_done=s.on_done, pad_id=0)
    counts = {"num_output_tokens": np.array([[2]], dtype=np.int32)}
    for tokens, index in (([5, 6], 2), ([7], 0), ([8, 9, 4], 1)):
        group.send(_row(tokens, index, cum_log_probs=np.array([[-float(index)]], dtype=np.float32),
                        **{k: v.copy() for k, v in counts.items()}), row_done=True)
    ((response, final),) = s.sent
    assert final and s.done == 1
    assert response["output_ids"].tolist() == [[[7, 0, 0], [8, 9, 4], [5, 6, 0]]]  # by sequence_index, padded
    assert response["sequence_length"].tolist() == [[1, 3, 2]]
    assert response["cum_log_probs"].tolist() == [[0.0, -1.0, -2.0]]
    assert response["num_output_tokens"].tolist() == [[6]]
    assert "sequence_index" not in response and response["request_key"].tolist() == [[9]]


def test_unary_answers_the_first_error_and_nothing_else():
    s = Sender()
    group = ResponseGroup(2, decoupled=False, send=s.send, on_done=s.on_done)
    group.send(RowError("bad", "INVALID_ARG"), row_done=True)
    assert group.failed  # the other rows' sinks now report cancelled
    group.send(_row([1], 1), row_done=True)
    assert s.sent == [(RowError("bad", "INVALID_ARG"), True)] and s.done == 1


def test_one_sequence_is_sent_as_it_is():
    row = _row([1, 2], 0)
    assert stack_sequences([row]) is row


def test_abandon_marks_the_group_for_cancelling_without_sending():
    """A send that failed on the send thread (the client went away): the rows' sinks report cancelled from then on."""
    s = Sender()
    group = ResponseGroup(2, decoupled=True, send=s.send, on_done=s.on_done)
    assert not group.abandoned
    group.abandon()
    assert group.abandoned and s.sent == [] and s.done == 0


def test_decoupled_first_error_is_the_final_response_and_the_other_rows_are_dropped():
    """As one TensorRT-LLM response ends a request: in the ensemble nothing may follow the error (stream_errors.py)."""
    s = Sender()
    group = ResponseGroup(3, decoupled=True, send=s.send, on_done=s.on_done)
    group.send(_row([1], 0), row_done=False, on_sent=print)
    group.send(RowError("request timed out: ...", "UNAVAILABLE"), row_done=True)
    assert group.failed and s.sent[-1] == (RowError("request timed out: ...", "UNAVAILABLE"), True)
    dropped = []
    group.send(_row([2], 1), row_done=False, on_sent=lambda: dropped.append(1))  # a cancelled row still talking
    group.send(RowError("request cancelled", "CANCELLED"), row_done=True)  # its end, as cancelled
    assert dropped == [1] and s.done == 0  # the dropped response counts as gone out (RowStream holds nothing)
    group.send(None, row_done=True)
    assert len(s.sent) == 2 and s.done == 1  # no second final; the group is done once its last row ends
