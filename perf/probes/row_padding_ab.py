"""Would padding each oneDNN linear's rows to a few buckets pay? oneDNN builds and keeps a primitive for every
distinct row count (perf/probes/onednn_rows_memory.py), so the served engine's memory grows with the step sizes it
meets until oneDNN's caches fill (perf/SOAK.md). Padding rows above EXACT_ROWS up to one of 8 row counts an octave
(at most 12.5 % more rows) bounds that; this measures what it costs a prefill: the in-process engine (demo model,
2 threads, no thread governor, no prefix reuse) prefills prompts of --lengths tokens with PrepackedLinear as it is
(exact rows) and with its rows padded, interleaved, --repeats times each; the first repeat of each is dropped
(primitive creation), so both sides run cached primitives: exact rows' best case. A measurement, not a test.

    .venv/bin/python perf/probes/row_padding_ab.py --lengths 17 33 65 300 1000 --repeats 7
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import itertools
import statistics
import time

import torch
import torch.nn.functional as F

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.prepacked_linear import PrepackedLinear
from ensembles import artifacts

EXACT_ROWS = 16  # decode batches run as they are
BUCKETS_PER_OCTAVE = 8


def padded_rows(rows: int) -> int:
    """rows up to EXACT_ROWS as they are; above, rounded up to a multiple of 1/8 of the power of two <= rows."""
    if rows <= EXACT_ROWS:
        return rows
    step = (1 << (rows.bit_length() - 1)) // BUCKETS_PER_OCTAVE
    return -(-rows // step) * step


def padded_forward(self: PrepackedLinear, x: torch.Tensor) -> torch.Tensor:
    """PrepackedLinear.forward on (rows, in) with rows zero-padded to padded_rows and the output cropped back."""
    rows = x.shape[0]
    y = torch.ops.mkldnn._linear_pointwise(F.pad(x, (0, 0, 0, padded_rows(rows) - rows)), self.packed, self.bias,
                                           "none", [], "")
    return y[:rows]


def prefill_s(engine: LLMEngine, prompt: tuple[int, ...], request_id: str) -> float:
    engine.add_request(Request(request_id, prompt, SamplingParams(max_tokens=1)))
    began = time.perf_counter()
    while engine.has_work():
        engine.step()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[17, 33, 65, 300, 1000])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.repeats < 2 or min(args.lengths) < 1 or max(args.lengths) >= 2048:
        parser.error("--repeats >= 2 and prompt lengths in [1, 2047]")
    torch.set_num_threads(2)
    engine = LLMEngine(artifacts.demo().engine_dir, EngineConfig(
        device="cpu", num_threads=2, adaptive_threads=False, enable_kv_cache_reuse=False))
    modes = {"padded": padded_forward, "exact": PrepackedLinear.forward}
    times: dict[tuple[int, str], list[float]] = {}
    ids = itertools.count()
    for n in args.lengths:
        for _ in range(args.repeats):
            for mode, forward in modes.items():
                PrepackedLinear.forward = forward
                i = next(ids)
                prompt = tuple((7 * j + i) % 500 + 1 for j in range(n))
                times.setdefault((n, mode), []).append(prefill_s(engine, prompt, f"q{i}"))
    PrepackedLinear.forward = modes["exact"]
    for n in args.lengths:
        padded, exact = (statistics.median(times[(n, mode)][1:]) * 1e3 for mode in modes)
        print(f"prefill of {n:4d} tokens ({padded_rows(n)} rows padded): padded {padded:7.2f} ms, "
              f"exact {exact:7.2f} ms, ratio {padded / exact:.3f}")


if __name__ == "__main__":
    main()
