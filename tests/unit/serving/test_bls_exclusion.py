"""The server-wide BLS exclusion (backend/serving/bls_exclusion.py): exclusive across processes and across threads of
one process, one file per server and user, and the acknowledgement parameter read strictly."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from backend.serving.bls_exclusion import (
    ACK_PARAMETER,
    BlsExclusion,
    Reply,
    exclusion_path,
    held,
    remove_exclusion,
    wants_ack,
)


def _hold_in_child(path, holding, release) -> None:
    exclusion = BlsExclusion(path)
    with exclusion.held():
        holding.set()
        release.wait(30)


def test_excludes_another_process(tmp_path):
    path = tmp_path / "x.lock"
    ctx = multiprocessing.get_context("spawn")
    holding, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_in_child, args=(path, holding, release))
    child.start()
    try:
        assert holding.wait(60), "the child never took the lock"
        entered = threading.Event()
        exclusion = BlsExclusion(path)

        def take():
            with exclusion.held():
                entered.set()

        taker = threading.Thread(target=take)
        taker.start()
        assert not entered.wait(0.5), "entered while another process held the lock"
        release.set()
        assert entered.wait(30), "never entered after the other process let go"
        taker.join(5)
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0


def test_excludes_threads_of_one_process(tmp_path):
    exclusion = BlsExclusion(tmp_path / "x.lock")
    inside, most = [0], [0]
    guard = threading.Lock()

    def work():
        for _ in range(200):
            with exclusion.held():
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1


def test_released_when_the_body_raises(tmp_path):
    exclusion = BlsExclusion(tmp_path / "x.lock")
    with pytest.raises(RuntimeError):
        with exclusion.held():
            raise RuntimeError("boom")
    other = BlsExclusion(tmp_path / "x.lock")
    done = threading.Event()
    threading.Thread(target=lambda: (other.held().__enter__(), done.set()), daemon=True).start()
    assert done.wait(5), "the lock stayed held after an exception"


def test_one_file_per_server_and_user(tmp_path):
    assert exclusion_path(123, tmp_path) == tmp_path / f"tritonllm-bls-{os.getuid()}-123.lock"
    assert exclusion_path(123, tmp_path) != exclusion_path(124, tmp_path)
    assert exclusion_path(folder=tmp_path).name.endswith(f"-{os.getppid()}.lock")  # inside a stub: the server


def test_removed_after_its_server(tmp_path):
    BlsExclusion(exclusion_path(123, tmp_path))
    remove_exclusion(123, tmp_path)
    assert list(tmp_path.iterdir()) == []
    remove_exclusion(123, tmp_path)  # gone already (a server that never loaded a decoupled model): nothing to do


def test_refuses_a_link_planted_at_its_name(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "x.lock"
    link.symlink_to(target)
    with pytest.raises(OSError):
        BlsExclusion(link)


def test_file_is_private_to_its_user(tmp_path):
    BlsExclusion(tmp_path / "x.lock")
    assert (tmp_path / "x.lock").stat().st_mode & 0o077 == 0


def test_held_none_holds_nothing(tmp_path):
    with held(None):
        pass
    exclusion = BlsExclusion(tmp_path / "x.lock")
    with held(exclusion):
        assert exclusion._lock.locked()
    assert not exclusion._lock.locked()


@pytest.mark.parametrize("parameters, expected", [
    ({ACK_PARAMETER: True}, True),
    (f'{{"{ACK_PARAMETER}": true, "x-tenant-id": "a"}}', True),
    ({ACK_PARAMETER: "true"}, False),
    ({ACK_PARAMETER: 1}, False),
    ({ACK_PARAMETER: False}, False),
    ({}, False),
    ("", False),
    ("not json", False),
    ("[1, 2]", False),
])
def test_wants_ack_only_for_true(parameters, expected):
    assert wants_ack(parameters) is expected


class _Sender:
    """A response sender recording each send and which locks were held during it."""

    def __init__(self, exclusion=None, lock=None):
        self.sent, self.exclusion, self.lock = [], exclusion, lock

    def send(self, response=None, flags=0):
        held_now = (self.exclusion is not None and self.exclusion._lock.locked(),
                    self.lock is not None and self.lock.locked())
        self.sent.append((response, flags, held_now))

    def is_cancelled(self):
        return False


def test_reply_sends_under_the_exclusion_and_the_send_lock(tmp_path):
    exclusion, lock = BlsExclusion(tmp_path / "x.lock"), threading.Lock()
    sender = _Sender(exclusion, lock)
    Reply(sender, lock, exclusion).send("r", flags=2)
    Reply(sender, lock).send("ack")
    assert sender.sent == [("r", 2, (True, True)), ("ack", 0, (False, True))]
    assert not exclusion._lock.locked() and not lock.locked()
    assert Reply(sender).is_cancelled() is False


def test_a_send_waiting_for_the_exclusion_never_holds_back_an_acknowledgement(tmp_path):
    """The caller of request B holds the exclusion until B's acknowledgement arrives, while a send to request A
    waits for it: that send must not hold the model's send lock meanwhile."""
    path, lock = tmp_path / "x.lock", threading.Lock()
    caller, model = BlsExclusion(path), BlsExclusion(path)
    sender = _Sender()
    acknowledged = threading.Event()
    with caller.held():  # the caller's exec() of B
        waiting = threading.Thread(target=lambda: Reply(sender, lock, model).send("A's token"))
        waiting.start()
        time.sleep(0.2)  # A's send waits for the exclusion
        ack = threading.Thread(target=lambda: (Reply(sender, lock).send("B's ack"), acknowledged.set()))
        ack.start()
        assert acknowledged.wait(5), "the acknowledgement waited behind a send waiting for the exclusion"
    waiting.join(5)
    assert [r for r, _, _ in sender.sent] == ["B's ack", "A's token"]
