"""ThreadGovernor: probes neighbouring thread counts on steps of one shape and keeps the faster, against a machine
whose step time per thread count the test sets (a quiet one, then a contended one)."""
from __future__ import annotations

import pytest

from backend.engine.thread_governor import ThreadGovernor, thread_levels

DECODE = (16, 16)  # 16 sequences, one token each


class Machine:
    """Step time by thread count; records what the governor applied."""

    def __init__(self, times: dict[int, float]) -> None:
        self.times, self.applied = times, []

    def set_threads(self, n: int) -> None:
        self.applied.append(n)

    def run(self, governor: ThreadGovernor, steps: int, shape=DECODE) -> list[int]:
        used = []
        for _ in range(steps):
            n = governor.begin(shape)
            used.append(n)
            governor.end(self.times[n])
        return used


def test_levels():
    assert thread_levels(1) == [1]
    assert thread_levels(2) == [1, 2]
    assert thread_levels(6) == [1, 2, 4, 6]
    assert thread_levels(8) == [1, 2, 4, 8]


def test_quiet_machine_keeps_every_core_and_probes_less_and_less():
    machine = Machine({1: 0.135, 2: 0.084})
    governor = ThreadGovernor(2, machine.set_threads)
    used = machine.run(governor, 2000)
    assert governor.current == 2 and governor.switches == 0
    # Each probe runs 2 steps at 1 thread; the wait between probes doubles to 512 steps.
    assert used.count(1) <= 2 * 9, used.count(1)
    assert governor.period == 512


def test_contention_moves_to_one_thread_and_back_when_it_ends():
    machine = Machine({1: 0.157, 2: 0.337})
    governor = ThreadGovernor(2, machine.set_threads)
    machine.run(governor, 40)
    assert governor.current == 1 and governor.switches == 1
    used = machine.run(governor, 200)
    assert used.count(2) <= 0.05 * len(used), used.count(2)  # the probes of 2 threads: a few steps in 200
    machine.times = {1: 0.135, 2: 0.084}  # the other process ended
    machine.run(governor, 600)
    assert governor.current == 2 and governor.switches == 2


def test_a_margin_keeps_the_current_count_on_a_near_tie():
    machine = Machine({1: 0.100, 2: 0.098})
    governor = ThreadGovernor(2, machine.set_threads)
    machine.run(governor, 1000)
    assert governor.current == 2 and governor.switches == 0


def test_steps_of_another_shape_never_count_in_a_probe():
    # 1 thread looks fast only on small steps: a probe mixing shapes would switch, one per shape must not.
    governor = ThreadGovernor(2, lambda n: None, probe_steps=2)
    times = {(1, 1): {1: 0.01, 2: 0.02}, (16, 16): {1: 0.2, 2: 0.1}}
    shapes = [(1, 1), (16, 16)] * 500  # alternate every step: no probe ever completes
    for shape in shapes:
        n = governor.begin(shape)
        governor.end(times[shape][n])
    assert governor.current == 2 and governor.switches == 0


def test_steps_of_a_changing_batch_run_at_the_current_count():
    # Shapes changing every step (short generations, arrivals beside decoding rows): no probe starts, so no step runs
    # at the candidate count; before, each step started a probe and ran at one thread.
    machine = Machine({1: 0.2, 2: 0.1})
    governor = ThreadGovernor(2, machine.set_threads)
    used = [n for _ in range(300) for n in machine.run(governor, 1, (16, 2048)) + machine.run(governor, 1, DECODE)]
    assert used == [2] * 600


def test_a_passing_shape_ends_a_probe_and_runs_at_the_current_count():
    machine = Machine({1: 0.2, 2: 0.1})
    governor = ThreadGovernor(2, machine.set_threads, probe_steps=2, min_period=8)
    assert machine.run(governor, 1) == [2]  # the first step: nothing to be steady with
    assert machine.run(governor, 1) == [1]  # step 2: a probe starts with the candidate (min_period // 4 = 2)
    assert machine.run(governor, 1, (16, 2048)) == [2]  # a prefill: the probe ends, the step keeps the current count
    assert governor.probe is None
    assert machine.run(governor, 2) == [2, 1]  # decode again: steady from its second step, where a new probe starts


def test_only_changes_are_applied():
    machine = Machine({1: 0.1, 2: 0.05})
    governor = ThreadGovernor(2, machine.set_threads)
    machine.run(governor, 100)
    assert all(a != b for a, b in zip(machine.applied, machine.applied[1:]))


def test_one_thread_never_probes():
    machine = Machine({1: 0.1})
    governor = ThreadGovernor(1, machine.set_threads)
    assert machine.run(governor, 100) == [1] * 100 and governor.probe is None


def test_more_cores_climb_one_level_at_a_time():
    machine = Machine({1: 0.4, 2: 0.2, 4: 0.1, 8: 0.3})  # 8 threads oversubscribe: 4 is best
    governor = ThreadGovernor(8, machine.set_threads)
    machine.run(governor, 400)
    assert governor.current == 4


@pytest.mark.parametrize("kwargs", [{"max_threads": 0}, {"max_threads": 2, "probe_steps": 0},
                                    {"max_threads": 2, "min_period": 64, "max_period": 32},
                                    {"max_threads": 2, "margin": 1.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="invalid governor settings"):
        ThreadGovernor(set_threads=lambda n: None, **kwargs)
