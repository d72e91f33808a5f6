"""retain_freed_memory: glibc takes both thresholds, and a large block freed and taken again reuses its pages instead
of faulting in fresh ones each time (what every prefill did: backend/model/host_memory.py). Each way runs in a fresh
process (the settings are process-wide), with malloc itself: torch's allocations go through posix_memalign, whose
padding can keep a block of the same size from fitting the one just freed, so a loop of equal torch tensors measures
that, not the thresholds (the engine's own effect is measured in perf/ISSUE16.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from backend.model.host_memory import ENVIRONMENT

CYCLES, BLOCK = 12, 64 << 20  # past glibc's largest dynamic mmap threshold (32 MiB): fresh pages each time by default

_PROBE = f"""
import ctypes, resource, sys
import backend
from backend.model.host_memory import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
if sys.argv[1] == "environment":
    assert not retain_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
faults = []
for _ in range({CYCLES}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc({BLOCK})
    ctypes.memset(block, 1, {BLOCK})
    libc.free(ctypes.c_void_p(block))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


def _faults_after_the_first_cycle(mode: str, env: dict[str, str] | None = None) -> int:
    clean = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True, text=True,
                         env={**clean, **(env or {})})
    return int(out.stdout.split()[-1])


def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    pages = (CYCLES - 1) * BLOCK // 4096
    default, retained = _faults_after_the_first_cycle("default"), _faults_after_the_first_cycle("retain")
    assert default >= pages * 0.9  # glibc's default: every cycle maps fresh pages, one fault each
    assert retained <= default / 4, (retained, default)


@pytest.mark.parametrize("var, value", [("MALLOC_TRIM_THRESHOLD_", "131072"),
                                        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")])
def test_the_environment_s_own_malloc_settings_stand(var, value):
    """Where the environment tunes glibc's malloc itself, retain_freed_memory leaves it (and says so by returning
    False): with an explicit 128 KiB trim threshold freed blocks go back to the kernel as before."""
    pages = (CYCLES - 1) * BLOCK // 4096
    assert _faults_after_the_first_cycle("environment", {var: value}) >= pages * 0.9
