"""The float32 GEMV over a bf16 checkpoint's weights held in bf16 (now) against the same weights held in float32
(before), paired: one engine, each decode step alternating between the two copies of every linear (the kernel
widens bf16 exactly and sums in the same order, so both give the same bits and the sequences stay the same), the
median step of each. A bf16 checkpoint runs as a float32 model on a CPU without native bf16 (linear_dtype 'auto'),
the case this serves. A measurement, not a test.

    .venv/bin/python perf/probes/gemv_bf16_copy_ab.py --hf perf/out/llama125m --batch 1
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from decode_step_ab import engine_and_batch, paired_steps  # noqa: E402

from backend.engine.llm_engine import LLMEngine  # noqa: E402
from backend.model.prepacked_linear import PrepackedLinear  # noqa: E402
from ensembles import artifacts  # noqa: E402


class Copies:
    """Every GEMV copy of the engine's model in bf16 (as loaded) and in float32, switched per step."""

    def __init__(self, engine: LLMEngine) -> None:
        modules = engine.runner.model.modules()
        self.linears = [m for m in modules if isinstance(m, PrepackedLinear) and m.gemv is not None]
        if not self.linears or any(m.gemv.dtype != torch.bfloat16 or m.dtype != torch.float32 for m in self.linears):
            raise SystemExit("needs float32 linears with bf16 GEMV copies: a bf16 checkpoint on a CPU without "
                             "native bf16")
        self.copies = {True: [m.gemv for m in self.linears], False: [m.gemv.float() for m in self.linears]}
        self.native, self.layers = engine.runner.native_layers, engine.runner.model.transformer.layers

    def use(self, bf16: bool) -> None:
        for m, copy in zip(self.linears, self.copies[bf16]):
            m.gemv = copy
        if self.native is not None:  # the compiled layers hold their own list of the copies
            self.native.collect_weights(self.layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, required=True, help="an HF checkpoint (converted to bfloat16)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="generations of 128 tokens per prompt")
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf, "bfloat16")
    engine, batch = engine_and_batch(model.engine_dir, args.hf, args.batch)
    copies = Copies(engine)
    times = paired_steps(engine, batch, args.rounds, copies.use)
    engine.close()
    before, now = (statistics.median(times[x]) * 1e3 for x in (False, True))
    print(f"{args.hf.name} bfloat16 batch {args.batch}, {torch.get_num_threads()} threads: {len(times[True])} decode "
          f"steps each; median float32 copies {before:.3f} ms, bf16 copies {now:.3f} ms, bf16 / float32 "
          f"{now / before:.3f}")


if __name__ == "__main__":
    main()
