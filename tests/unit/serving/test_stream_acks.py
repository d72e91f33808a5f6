"""stream_acks: postprocessing's acks of streamed responses, read back by the tensorrt_llm model's rows."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend.serving.stream_acks import AckBoard, AckWriter, ack_path, open_board


@pytest.fixture
def board(tmp_path):
    board = AckBoard(slots=4, directory=tmp_path)
    yield board
    board.close()


def test_a_rows_acked_count_is_the_last_stamp_postprocessing_wrote(board, tmp_path):
    slot, other = board.lease(), board.lease()
    writer = AckWriter(tmp_path)  # another process in the server: it finds the file by the stamp's key
    assert slot.acked() == 0
    writer.ack(np.concatenate([slot.stamp(1), other.stamp(5)]))  # (B, 3): one per batch row
    assert slot.acked() == 1 and other.acked() == 5
    writer.ack(slot.stamp(2))
    assert slot.acked() == 2


def test_a_reused_slot_ignores_its_earlier_rows_acks(board, tmp_path):
    first = board.lease()
    late = first.stamp(7)
    first.release()
    first.release()  # once only
    for _ in range(3):  # slots are reused least recently freed first
        board.lease()
    again = board.lease()
    assert again.slot == first.slot and again.generation != first.generation
    AckWriter(tmp_path).ack(late)  # the earlier row's ack arrives after the slot's next row began
    assert again.acked() == 0
    assert board.lease() is None  # every slot taken: a row then goes without acks


@pytest.mark.parametrize("ack", [[[123456789, 0, 1]], [[0, 0, 1]], [[-5, 0, 1]], "bad slot", "negative stamp"])
def test_acks_naming_no_file_or_slot_are_skipped(board, tmp_path, ack):
    slot = board.lease()
    if ack == "bad slot":
        ack = [[board.key, 4, 1]]
    elif ack == "negative stamp":
        ack = [[board.key, slot.slot, -1]]
    writer = AckWriter(tmp_path)
    writer.ack(np.array(ack, dtype=np.int64))
    assert slot.acked() == 0 and list(writer._boards) in ([], [board.key])  # made-up keys are not remembered


def test_close_removes_the_file(tmp_path):
    board = AckBoard(slots=2, directory=tmp_path)
    assert ack_path(board.key, tmp_path).stat().st_size == 16
    board.close()
    assert not ack_path(board.key, tmp_path).exists()


def test_without_a_writable_directory_there_is_no_board(tmp_path):
    assert open_board(2, tmp_path / "missing") is None


def test_a_new_board_removes_files_of_processes_that_are_gone(tmp_path):
    """A killed process never unlinks its file; its lock goes with it. A file still locked is a live server's, even
    one in another PID namespace, where its process cannot be seen."""
    code = ("import os, sys, signal; from pathlib import Path; from backend.serving.stream_acks import AckBoard; "
            "board = AckBoard(slots=2, directory=Path(sys.argv[1])); print(board.path, flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    killed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[3], check=False)
    dead = Path(killed.stdout.strip())
    assert killed.returncode == -signal.SIGKILL and dead.exists()
    alive = AckBoard(slots=2, directory=tmp_path)
    board = AckBoard(slots=2, directory=tmp_path)
    assert not dead.exists() and alive.path.exists() and board.path.exists()
    assert board.key != alive.key
    board.close()
    alive.close()
    assert not list(tmp_path.iterdir())  # nothing left, the hidden names included
