"""Probe: does torch.compile (Inductor, dynamic shapes) of the decoder layers run on the in-process engine, how long
does it compile, and how fast is a compiled decode step next to an eager one? A measurement, not a test; the
result is recorded in perf/ISSUE16.md ("The batch-1 floor").

    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT .venv/bin/python perf/compile_probe.py [--hf perf/out/llama125m]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_engine import start_engine, timed_steps  # noqa: E402

from ensembles import artifacts  # noqa: E402


def probe(engine_dir: Path, batch: int, threads: int, compiled_kernel: str | None) -> None:
    """The eager engine keeps the config's default linears (oneDNN prepacked); the compiled one may use others."""
    eager = start_engine(engine_dir, batch, 128, 48, num_threads=threads)
    kernel = {"linear_kernel": compiled_kernel} if compiled_kernel else {}
    compiled = start_engine(engine_dir, batch, 128, 48, num_threads=threads, **kernel)
    model = compiled.runner.model
    began = time.perf_counter()
    model.run_layers = torch.compile(model.run_layers, dynamic=True)
    # The engine catches a failed forward itself and fails the step's requests with the error as their message.
    errors = [out.error for _ in range(2) for out in compiled.step() if out.error]
    if errors:
        first_lines = " ".join(errors[0].splitlines()[:2])
        print(f"batch {batch}: compiling failed after {time.perf_counter() - began:.1f} s: {first_lines}")
        return
    print(f"batch {batch}: compile and two steps {time.perf_counter() - began:.1f} s")
    for _ in range(3):
        print(f"batch {batch}: eager {timed_steps(eager, 24) * 1e3:.1f} ms, "
              f"compiled {timed_steps(compiled, 24) * 1e3:.1f} ms a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", type=Path, default=Path("perf/out/llama125m"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--linear-kernel", help="the compiled engine's EngineConfig.linear_kernel ('torch': plain "
                        "linears, which Inductor can lower; TORCHINDUCTOR_FREEZING=1 lets it prepack them itself)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine_dir = artifacts.from_hf(args.hf).engine_dir
    for batch in (1, 16):
        probe(engine_dir, batch, args.threads, args.linear_kernel)


if __name__ == "__main__":
    main()
