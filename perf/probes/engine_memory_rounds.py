"""Where does the engine process's memory go under the soak's load? The in-process engine (demo model, the served
KV capacity of 512 blocks) runs the soak's request mix (perf/soak.py: its six prompts, 16 in flight, max_tokens
16-128, one in ten aborted after 2-6 tokens, three priority levels) for --rounds rounds of --requests requests.
After each round, at idle: the process's RSS, the Python heap traced by tracemalloc, glibc's heap (mallinfo2: bytes
in use, bytes free but kept, mmapped) and what malloc_trim(0) gives back. Growth of Python objects shows in
tracemalloc (with where they were allocated); growth of native allocations in use shows in mallinfo2's in-use
bytes; memory the allocator keeps after frees shows in its free bytes and comes back with malloc_trim.
A measurement, not a test.

    .venv/bin/python perf/probes/engine_memory_rounds.py --rounds 6 --requests 400
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import ctypes
import gc
import random
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soak import PROMPTS  # noqa: E402

from backend.engine.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from backend.engine.sampling_params import SamplingParams  # noqa: E402
from backend.engine.sequence import Request  # noqa: E402
from ensembles import artifacts  # noqa: E402

MIB = 2**20
IN_FLIGHT = 16  # the served running batch; the soak keeps it saturated


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (glibc >= 2.33): ten size_t fields, in this order.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


@dataclass(frozen=True)
class Sample:
    rss: float  # MiB
    python: float  # MiB traced by tracemalloc
    heap_used: float  # MiB: glibc main arena and other arenas' bytes in use + mmapped chunks
    heap_free: float  # MiB: bytes glibc holds free (fragments, top of heap not yet returned)
    trimmed: float  # MiB of RSS malloc_trim(0) gave back


def heap_mib() -> tuple[float, float]:
    """After a garbage collection, glibc's (bytes in use over all arenas plus its mmapped chunks, bytes it holds
    free), MiB: one mallinfo2 read."""
    gc.collect()
    info = _libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / MIB, info.fordblks / MIB


def heap_in_use_mib() -> float:
    return heap_mib()[0]


def sample(trim: bool) -> Sample:
    heap_used, heap_free = heap_mib()
    rss = psutil.Process().memory_info().rss / MIB
    trimmed = 0.0
    if trim:
        _libc.malloc_trim(0)
        trimmed = rss - psutil.Process().memory_info().rss / MIB
    return Sample(rss, tracemalloc.get_traced_memory()[0] / MIB, heap_used, heap_free, trimmed)


def run_round(engine: LLMEngine, prompts: list[tuple[int, ...]], rng: random.Random, tag: str, count: int,
              shapes: set[tuple[int, int]]) -> None:
    """count requests of the soak's mix, IN_FLIGHT at a time, each run to its end or aborted; adds each step's
    (sequences, tokens) to shapes: the row counts the step's linears ran with."""
    started, abort_at, produced = 0, {}, {}
    while started < count or engine.has_work():
        while started < count and len(engine.sequences) < IN_FLIGHT:
            rid = f"{tag}-{started}"
            engine.add_request(Request(rid, rng.choice(prompts), SamplingParams(max_tokens=rng.randint(16, 128)),
                                       priority=rng.choice([0, 1, 2])))
            if rng.random() < 0.1:
                abort_at[rid] = rng.randint(2, 6)
            produced[rid], started = 0, started + 1
        outputs = engine.step()
        last = engine.last_step
        shapes.add((last.scheduled, last.scheduled - last.context + last.context_tokens))
        for out in outputs:
            produced[out.request_id] += len(out.new_token_ids)
            if not out.finished and produced[out.request_id] >= abort_at.get(out.request_id, 10**9):
                engine.abort(out.request_id)
            if out.finished or out.request_id not in engine.sequences:  # ended: forget it (this loop's own memory)
                produced.pop(out.request_id)
                abort_at.pop(out.request_id, None)


def top_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, limit: int) -> list[str]:
    stats = after.compare_to(before, "traceback")
    where = lambda s: " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(s.traceback[-4:]))  # noqa: E731
    return [f"  {s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks  {where(s)}" for s in stats[:limit]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=400, help="requests a round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--linear-kernel", default="onednn", choices=["onednn", "torch"])
    parser.add_argument("--frames", type=int, default=8, help="traceback depth tracemalloc keeps")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after each round's sample")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.rounds < 2 or args.requests < 1 or args.threads < 1 or args.frames < 1:
        parser.error("--rounds >= 2, --requests, --threads and --frames >= 1")
    torch.set_num_threads(args.threads)
    demo = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(demo.tokenizer_dir)
    prompts = [tuple(tok(p)["input_ids"]) for p in PROMPTS]
    engine = LLMEngine(demo.engine_dir, EngineConfig(
        device="cpu", num_threads=args.threads, linear_kernel=args.linear_kernel, max_batch_size=IN_FLIGHT,
        max_tokens_in_paged_kv_cache=512 * 32))
    rng = random.Random(args.seed)
    tracemalloc.start(args.frames)
    print(f"{'round':>5} {'RSS':>8} {'python':>8} {'heap used':>10} {'heap free':>10} {'trimmed':>8}  (MiB)"
          f" {'step shapes':>12} {'new':>5} {'round s':>8}")
    shapes: set[tuple[int, int]] = set()
    show = lambda name, s, new, secs: print(  # noqa: E731
        f"{name:>5} {s.rss:8.1f} {s.python:8.1f} {s.heap_used:10.1f} {s.heap_free:10.1f} {s.trimmed:8.1f} "
        f"{len(shapes):12d} {new:5d} {secs:8.1f}")
    show("idle", sample(args.trim), 0, 0.0)
    first = None
    for r in range(1, args.rounds + 1):
        known, began = len(shapes), time.perf_counter()
        run_round(engine, prompts, rng, f"r{r}", args.requests, shapes)
        show(str(r), sample(args.trim), len(shapes) - known, time.perf_counter() - began)
        if r == 1:
            first = tracemalloc.take_snapshot()
    last = tracemalloc.take_snapshot()
    print(f"Python allocations grown since round 1 (tracemalloc, {args.frames} frames), largest first:")
    print("\n".join(top_growth(first, last, 8)))
    engine.close()


if __name__ == "__main__":
    main()
