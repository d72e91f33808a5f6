"""Which CPUs the served engine's step thread has to itself, and which are left to tritonserver and the other models.

Measured on the 2-core machine (perf/ISSUE16.md, "CPU placement of the served engine"): the demo model's decode
step slows 1.3-1.44x when a process on the other core streams through the shared L3 or DRAM, not at all beside pure
computation; served at 16 streams, the engine's step thread alone on one CPU with everything else on the other raised
the ensemble from 0.67-0.69 to 0.79-0.80 of in-process throughput (tensorrt_llm direct 0.83 -> 0.84-0.85). Pinning
the step thread alone, with Triton free to run beside it, gained nothing: what pays is keeping Triton's threads off
the engine's CPUs.

The engine model reads its CPUs from the `engine_cpus` parameter (a list such as "1" or "2-3,6"); the launcher
(ensembles) starts tritonserver on the others, so that every stub inherits them and only the engine's step thread
(and the OpenMP threads it starts) runs on the engine's CPUs.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpu_list(text: str) -> frozenset[int]:
    """"0", "2-3", "0,2-3" (taskset -c's notation) -> CPU numbers; ValueError naming what is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"engine_cpus must be a CPU list such as 1 or 0,2-3, got {text!r}")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise ValueError(f"engine_cpus range {part.strip()!r} ends before it starts")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """{0, 2, 3} -> "0,2-3"."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclass(frozen=True)
class CpuSplit:
    """The engine's CPUs and the rest, disjoint and both non-empty."""

    engine: frozenset[int]
    rest: frozenset[int]

    def __post_init__(self) -> None:
        if not self.engine or not self.rest:
            raise ValueError(f"engine_cpus must leave CPUs to both the engine and tritonserver, got engine "
                             f"{format_cpu_list(self.engine) or 'none'}, rest {format_cpu_list(self.rest) or 'none'}")
        if self.engine & self.rest:
            raise ValueError(f"CPUs {format_cpu_list(self.engine & self.rest)} are both the engine's and the rest's")


def split_cpus(spec: str, engine_threads: int | None, available: Iterable[int] | None = None) -> CpuSplit | None:
    """spec "" (no placement), "auto" (the last engine_threads CPUs when there are more CPUs than that, else none)
    or a CPU list, against the CPUs this process may use."""
    available = frozenset(os.sched_getaffinity(0) if available is None else available)
    if not spec:
        return None
    if spec == "auto":
        if engine_threads is None:
            raise ValueError("engine_cpus auto needs engine_threads: it gives the engine that many CPUs")
        if len(available) <= engine_threads:
            return None  # no CPU would be left to tritonserver: no placement
        engine = frozenset(sorted(available)[-engine_threads:])
    else:
        engine = parse_cpu_list(spec)
        if missing := engine - available:
            raise ValueError(f"engine_cpus {spec!r} names CPUs {format_cpu_list(missing)} this process may not use "
                             f"(it may use {format_cpu_list(available)})")
        check_engine_threads(engine, engine_threads)
    return CpuSplit(engine, available - engine)


def check_engine_threads(engine: frozenset[int], engine_threads: int | None) -> None:
    """More torch threads than pinned CPUs would share them (each OpenMP barrier waits for a descheduled one)."""
    if engine_threads is None or engine_threads > len(engine):
        raise ValueError(f"engine_cpus {format_cpu_list(engine)} needs engine_threads set to at most "
                         f"{len(engine)}, got {engine_threads}")


def pin_calling_thread(cpus: frozenset[int]) -> None:
    """This OS thread (and the threads it starts later) on `cpus` only; other threads of the process keep theirs."""
    os.sched_setaffinity(0, cpus)  # pid 0: the calling thread (Linux)
