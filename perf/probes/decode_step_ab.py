"""A decode step now against the same step on a git revision's kernels and per-step Python, paired: one generation,
its decode steps alternating between the two (both build the same tensors and the kernels give the same bits, so
the sequences are the same whichever ran a step), the median step of each. What "the revision's" means here: its
compiled kernels (perf/probes/old_kernels.py) and, for the per-step Python, step_tensors' general path and torch's
argmax (what the revision before the decode shortcut and argmax_rows ran); with --kernels-only, the kernels alone.
A base before the GEMV's strip layout (the commit after e445799) reads the GEMV's weight copies in its own older
layout and gets other bits: compare across it with perf/probes/step_parts.py in two worktrees. A measurement, not
a test.

    .venv/bin/python perf/probes/decode_step_ab.py --hf perf/out/llama125m --dtype bfloat16 --batch 16 --base HEAD~1
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from old_kernels import build_at  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from backend.engine import sampler  # noqa: E402
from backend.engine.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from backend.engine.sampling_params import SamplingParams  # noqa: E402
from backend.engine.sequence import Request  # noqa: E402
from backend.model import runner, step_inputs  # noqa: E402
from build_engines.throughput import prompts  # noqa: E402
from ensembles import artifacts  # noqa: E402

NOW_TENSORS, NOW_ARGMAX = step_inputs.step_tensors, sampler.argmax_rows


def base_tensors(inputs, rotary, windows, dtype, device, paged_decode=False, causal_prefill=False):
    return step_inputs._step_tensors(inputs, rotary, windows, dtype, device, paged_decode, causal_prefill)


def base_argmax(logits):
    return logits.argmax(dim=-1).tolist()


class Switch:
    def __init__(self, engine: LLMEngine, base_kernels, kernels_only: bool = False) -> None:
        self.layers = engine.runner.native_layers
        self.kernels_only = kernels_only
        self.kernels = {True: self.layers.kernels if self.layers else None, False: base_kernels}

    def use(self, now: bool) -> None:
        if not self.kernels_only:
            runner.step_tensors = NOW_TENSORS if now else base_tensors
            sampler.argmax_rows = NOW_ARGMAX if now else base_argmax
        if self.layers is not None:
            self.layers.kernels = self.kernels[now]


def engine_and_batch(engine_dir: Path, hf: Path, size: int) -> tuple[LLMEngine, list]:
    """An engine for up to 16 sequences, prefix caching off, and `size` prompts of 128 tokens (hf's tokenizer)."""
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=16, device="cpu", enable_kv_cache_reuse=False))
    return engine, prompts(AutoTokenizer.from_pretrained(str(hf)), size, 128)


def paired_steps(engine: LLMEngine, batch: list, rounds: int, use) -> dict[bool, list[float]]:
    """`rounds` generations of 128 tokens for every prompt of `batch`, the decode steps alternating use(True) and
    use(False) (the first of each round alternating too): each side's step times (s), the prefills left out."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for i, p in enumerate(batch):
            engine.add_request(Request(f"r{r}-{i}", tuple(p), SamplingParams(max_tokens=128)))
        engine.step()  # the prefill, not timed
        k = 0
        while engine.has_work():
            side = (k + r) % 2 == 0
            use(side)
            start = time.perf_counter()
            engine.step()
            times[side].append(time.perf_counter() - start)
            k += 1
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, help="an HF checkpoint (default: the demo model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4, help="generations of 128 tokens per prompt")
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--kernels-only", action="store_true", help="switch the compiled kernels, not the Python")
    args = parser.parse_args()
    hf = args.hf or artifacts.demo().tokenizer_dir
    model = artifacts.from_hf(hf, args.dtype)
    engine, batch = engine_and_batch(model.engine_dir, hf, args.batch)
    switch = Switch(engine, build_at(args.base), args.kernels_only)
    times = paired_steps(engine, batch, args.rounds, switch.use)
    switch.use(True)
    base, now = (statistics.median(times[x]) * 1e3 for x in (False, True))
    print(f"{hf.name if args.hf else 'demo'} {args.dtype} batch {args.batch}: {len(times[True])} decode steps each; "
          f"median {args.base} {base:.3f} ms, now {now:.3f} ms, now / base {now / base:.3f} ({base - now:.3f} ms "
          f"less)")


if __name__ == "__main__":
    main()
