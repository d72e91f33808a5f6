"""Our engine in-process under the same closed-loop load a perf_analyzer client puts on the server: `concurrency`
requests outstanding, a new one submitted as soon as one finishes, until `len(prompts)` requests are done. No
Triton, no IPC, no client: what serving adds is the difference (perf/bench_report.py).

Every request generates exactly `max_tokens` tokens (no end id), so throughput = requests x max_tokens / span,
span = last token of the last request - first submission, as the server side computes it from perf_analyzer's
export. Time to first token = first generated token - submission.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request


@dataclass(frozen=True)
class LoadRun:
    """Per-request timings (ms) of one run and its throughput."""

    output_tok_s: float
    ttfts_ms: tuple[float, ...]
    latencies_ms: tuple[float, ...]


def closed_loop(engine: LLMEngine, prompts: list[list[int]], concurrency: int, max_tokens: int,
                tag: str = "r") -> LoadRun:
    if concurrency < 1 or not prompts:
        raise ValueError(f"need concurrency >= 1 and at least one prompt, got {concurrency} and {len(prompts)}")
    params = SamplingParams(max_tokens=max_tokens)  # end_id None: never stops early
    pending = deque(enumerate(prompts))
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}

    def submit() -> None:
        i, prompt = pending.popleft()
        rid = f"{tag}{i}"
        sent[rid] = time.perf_counter()
        engine.add_request(Request(rid, tuple(prompt), params))

    for _ in range(min(concurrency, len(pending))):
        submit()
    while engine.has_work():
        for out in engine.step():
            now = time.perf_counter()
            if out.new_token_ids:
                first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = now
                if pending:
                    submit()
    span = max(done.values()) - min(sent.values())
    return LoadRun(output_tok_s=len(done) * max_tokens / span,
                   ttfts_ms=tuple((first[r] - sent[r]) * 1e3 for r in done),
                   latencies_ms=tuple((done[r] - sent[r]) * 1e3 for r in done))
