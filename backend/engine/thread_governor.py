"""How many torch threads the next step gets: measured, not assumed (EngineConfig.adaptive_threads).

On a quiet CPU every core helps a step, most with OpenMP threads that spin briefly at barriers instead of sleeping
(backend/__init__.py: 125M model, 2 cores, decode batch 16: 84 ms a step at 2 threads vs 135 ms at 1). When another
process takes part of a core, a step at 2 threads waits at every barrier for a descheduled thread and collapses
(337 ms) while 1 thread holds (157 ms; perf/ISSUE16.md). No fixed count wins both, so the engine keeps trying: now
and then it runs a few steps at a neighbouring thread count, interleaved with steps at the current one, and keeps
whichever was faster. Only steps of the same shape are compared (same number of sequences and tokens: consecutive
decode steps, whose cost differs by one context position), so a change in the batch never reads as a change in the
machine; and a probe starts only on a step of the same shape as the one before it (a steady batch), so that a step of
a passing shape (a prompt's prefill between decode steps, which ends any probe) never runs at the candidate count.
Before, each such step started a new probe: shapes that changed every step (requests arriving while others decode,
or short generations) ran every step at the candidate count, a 2,048-token prefill at one thread of two in 1.23 s
instead of 0.66 (perf/ISSUE16.md). A probe that confirms the current count doubles the wait before the next one (up
to max_period steps); a switch brings it back to min_period.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

Shape = tuple[int, int]  # (sequences, tokens) of a step


def thread_levels(max_threads: int) -> list[int]:
    """1, 2, 4, ... and max_threads itself: the counts a governor moves between."""
    levels, n = [], 1
    while n < max_threads:
        levels.append(n)
        n *= 2
    return levels + [max_threads]


@dataclass
class _Probe:
    shape: Shape
    candidate: int  # the thread count tried against the current one
    schedule: list[int]  # thread count of each probe step, alternating candidate / current
    times: dict[int, list[float]] = field(default_factory=dict)


class ThreadGovernor:
    """begin(shape) -> the thread count for this step (applied through set_threads); end(seconds) after it."""

    def __init__(self, max_threads: int, set_threads: Callable[[int], None], probe_steps: int = 2,
                 min_period: int = 32, max_period: int = 512, margin: float = 0.05) -> None:
        if max_threads <= 0 or probe_steps <= 0 or not 0 < min_period <= max_period or not 0 <= margin < 1:
            raise ValueError(f"invalid governor settings: max_threads {max_threads}, probe_steps {probe_steps}, "
                             f"periods {min_period}-{max_period}, margin {margin}")
        self.levels, self.set_threads = thread_levels(max_threads), set_threads
        self.probe_steps, self.min_period, self.max_period, self.margin = probe_steps, min_period, max_period, margin
        self.current, self.applied = max_threads, None
        self.period, self.steps, self.next_probe = min_period, 0, min_period // 4
        self.probe: _Probe | None = None
        self.last_shape: Shape | None = None  # the step before this one's
        self._upward = False  # which neighbour the next probe tries first
        self.switches = 0

    def begin(self, shape: Shape) -> int:
        self.steps += 1
        steady, self.last_shape = shape == self.last_shape, shape
        if self.probe is not None and self.probe.shape != shape:
            self.probe = None  # the batch changed mid-probe: not comparable; try again once it is steady
        if self.probe is None and steady and self.steps >= self.next_probe and len(self.levels) > 1:
            self.probe = self._start_probe(shape)
        threads = self.probe.schedule[0] if self.probe is not None else self.current
        if threads != self.applied:
            self.set_threads(threads)
            self.applied = threads
        return threads

    def end(self, seconds: float) -> None:
        probe = self.probe
        if probe is None:
            return
        probe.times.setdefault(probe.schedule.pop(0), []).append(seconds)
        if not probe.schedule:
            self._decide(probe.candidate, probe.times)
            self.probe = None

    def _start_probe(self, shape: Shape) -> _Probe:
        i = self.levels.index(self.current)
        neighbours = [self.levels[j] for j in (i - 1, i + 1) if 0 <= j < len(self.levels)]
        self._upward = not self._upward
        candidate = neighbours[-1] if self._upward else neighbours[0]
        return _Probe(shape, candidate, [candidate, self.current] * self.probe_steps)

    def _decide(self, candidate: int, times: dict[int, list[float]]) -> None:
        if statistics.median(times[candidate]) < statistics.median(times[self.current]) * (1 - self.margin):
            self.current, self.period = candidate, self.min_period
            self.switches += 1
        else:
            self.period = min(self.period * 2, self.max_period)
        self.next_probe = self.steps + self.period
