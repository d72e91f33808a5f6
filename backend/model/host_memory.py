"""Freed host memory kept in the process's heap for the next step, instead of handed back to the kernel.

glibc's malloc serves a large block (over its mmap threshold, 128 KiB at first and raised dynamically up to 32 MiB)
with fresh pages from mmap, and returns the top of a heap to the kernel when more than its trim threshold lies free.
A prefill allocates and frees tens of megabytes of activations every layer (the MLP's (rows, 2 x intermediate)
products in float32 and bf16, their widened copies), so every step faulted the same pages in again, zeroed by the
kernel: 28,800 page faults in a 2,048-token demo prefill, 113,000 in the 125M model's, 18-37 % of the prefill's
time (perf/ISSUE16.md, "Page faults in every prefill"). With both thresholds raised the pages stay mapped and the
next step reuses them: the process keeps its peak heap, which it needed at that peak anyway (vLLM's CPU backend gets
the same from tcmalloc, which it asks users to preload).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
RETAIN_BYTES = 1 << 30  # blocks up to 1 GiB from the heap; free memory up to 1 GiB kept at the top of a heap
# glibc's own environment settings for these: where the environment sets any, it has chosen, and this leaves it
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def retain_freed_memory(limit: int = RETAIN_BYTES) -> bool:
    """Raise glibc malloc's mmap and trim thresholds to `limit` for this process (both at once: a trim threshold
    alone also switches off the dynamic mmap threshold, and every large block then faults in fresh pages). Returns
    whether glibc took both; False (logged) where the C library is not glibc, or where the environment sets glibc's
    malloc tunables itself (ENVIRONMENT: its choice stands). A malloc preloaded in glibc's place (tcmalloc, jemalloc)
    keeps freed memory on its own and ignores these."""
    chosen = [var for var in ENVIRONMENT if var in os.environ]
    if chosen:
        log.info("glibc malloc's thresholds left as the environment sets them (%s)", ", ".join(chosen))
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        log.info("freed host memory is handed back to the kernel: %s has no mallopt (not glibc)", name)
        return False
    taken = mallopt(M_MMAP_THRESHOLD, limit) == 1 and mallopt(M_TRIM_THRESHOLD, limit) == 1
    if not taken:
        log.info("freed host memory is handed back to the kernel: mallopt refused thresholds of %d bytes", limit)
    return taken
