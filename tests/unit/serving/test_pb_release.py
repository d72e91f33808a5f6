"""send_tensors holds its tensors through the send; BlsHold lets a finished iterator go hold_s later, on the
thread that calls keep()."""
import gc
import threading
import weakref

import pytest

from backend.serving.pb_release import BlsHold, release_at_finalize, send_tensors


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Iterator:
    """Stands in for a response iterator: notes the thread it was freed on."""

    freed_on: list[str] = []

    def __del__(self) -> None:
        Iterator.freed_on.append(threading.current_thread().name)


def test_an_iterator_lives_hold_s_longer_then_goes_on_a_later_keep():
    clock = Clock()
    hold = BlsHold(hold_s=30.0, clock=clock)
    first = Iterator()
    ref = weakref.ref(first)
    hold.keep(first)
    del first
    clock.now += 29.0
    hold.keep(Iterator())
    assert ref() is not None and len(hold) == 2  # not yet due
    clock.now += 1.0
    hold.keep(Iterator())
    gc.collect()
    assert ref() is None and len(hold) == 2  # the first went; the later two stay


def test_release_happens_on_the_thread_that_keeps():
    clock = Clock()
    hold = BlsHold(hold_s=1.0, clock=clock)
    Iterator.freed_on.clear()
    worker = threading.Thread(target=lambda: hold.keep(Iterator()), name="forwarding-thread")
    worker.start()
    worker.join()
    clock.now += 5.0
    keeper = threading.Thread(target=lambda: hold.keep(object()), name="next-request")
    keeper.start()
    keeper.join()
    assert Iterator.freed_on == ["next-request"]


def test_bad_hold():
    with pytest.raises(ValueError, match="hold_s must be > 0"):
        BlsHold(hold_s=0)


def test_send_tensors_holds_every_tensor_until_the_send_returned():
    """The backend drops the tensors the receiver did not ask for inside send(): none may be the last reference."""

    class PbUtils:
        @staticmethod
        def InferenceResponse(tensors):
            return list(tensors)  # the response's own references (C++ shared pointers in the backend)

    alive_during_send = []

    class Sender:
        def send(self, response, flags):
            refs = [weakref.ref(t) for t in response]
            response.clear()  # the backend's pruning: the response lets go of them
            gc.collect()
            alive_during_send.extend(r() is not None for r in refs)
            assert flags == 1

    send_tensors(PbUtils, Sender(), [Iterator(), Iterator()], flags=1)
    assert alive_during_send == [True, True]


def test_release_at_finalize_frees_what_cycles_held():
    class Model:
        pass

    model, sender = Model(), Iterator()
    ref = weakref.ref(sender)
    cycle = {"sender": sender}
    cycle["self"] = cycle  # a cycle only the collector frees
    model.state = cycle
    del sender, cycle
    gc.disable()
    try:
        release_at_finalize(model)
        assert ref() is None and vars(model) == {}
        assert gc.get_freeze_count() > 0  # what is left, frozen: the process's exit does not collect it again
    finally:
        gc.unfreeze()  # this is pytest's process, which goes on
        gc.enable()
