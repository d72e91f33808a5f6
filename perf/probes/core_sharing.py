"""How much does work on the other core slow the engine's step, by kind of work? The served engine runs one torch
thread beside Triton, the pre/postprocessing stubs and the load generator, and its step was measured 30-50 % slower
there than in-process (perf/ISSUE16.md). This pins the in-process engine (1 thread, every sequence decoding) to CPU 0
and a neighbour process to CPU 1, then times decode steps beside each neighbour, interleaved round by round:

  idle     no neighbour
  spin     pure Python integer loop: no memory traffic, no floating point
  fma      float32 matmuls on 64x64 operands (one thread): the FMA units, data in L1
  l3       copies between two 12 MiB buffers: the shared L3 (32 MiB here), little DRAM traffic
  dram     copies between two 256 MiB buffers: memory bandwidth

If `spin` or `fma` slows the engine, the two vCPUs share one physical core (SMT) even though the guest reports one
thread per core; `l3` and `dram` show cache and bandwidth contention. A measurement, not a test.

    .venv/bin/python perf/probes/core_sharing.py [--hf DIR] [--batch 16] [--steps 30] [--rounds 3]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from profile_engine import start_engine  # noqa: E402

from ensembles import artifacts  # noqa: E402

_COPY_LOOP = ("import numpy as np\na = np.ones({floats}, np.float32)\nb = np.empty_like(a)\n"
              "while True:\n    np.copyto(b, a)")
NEIGHBOURS = {
    "idle": None,
    "spin": "i = 0\nwhile True:\n    i = (i + 1) & 0xFFFF",
    "fma": ("import torch\ntorch.set_num_threads(1)\na = torch.rand(64, 64)\nb = torch.rand(64, 64)\n"
            "while True:\n    torch.mm(a, b)"),
    "l3": _COPY_LOOP.format(floats=3 << 20),  # 12 MiB each
    "dram": _COPY_LOOP.format(floats=64 << 20),  # 256 MiB each
}


def start_neighbour(kind: str, cpu: int) -> subprocess.Popen | None:
    code = NEIGHBOURS[kind]
    if code is None:
        return None
    pinned = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n" + code
    neighbour = subprocess.Popen([sys.executable, "-c", pinned], env={**os.environ, "OMP_NUM_THREADS": "1"})
    time.sleep(1.0)  # imports done, buffers touched: the loop is running
    return neighbour


def step_times(engine, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, help="a Hugging Face checkpoint (default: the demo model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed per neighbour and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.cpu_count() < 2:
        raise SystemExit("needs two CPUs")
    os.sched_setaffinity(0, {0})
    model = artifacts.from_hf(args.hf) if args.hf else artifacts.demo()
    kinds = list(NEIGHBOURS)
    medians: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        # A fresh engine a round (its sequences would run out of tokens); the order rotates so that the context's
        # growth within a round (steps x kinds tokens) does not favour one neighbour.
        engine = start_engine(model.engine_dir, args.batch, args.prompt_len, args.steps * len(kinds) // 3 + 4,
                              num_threads=1)
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            neighbour = start_neighbour(kind, cpu=1)
            try:
                medians[kind].append(statistics.median(step_times(engine, args.steps)) * 1e3)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
        del engine
    idle = statistics.median(medians["idle"])
    print(f"# {model.engine_dir.name}, batch {args.batch}, 1 torch thread on CPU 0, neighbour on CPU 1, "
          f"{args.steps} decode steps x {args.rounds} rounds, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print("| neighbour on CPU 1 | step ms, median per round | median | / idle |")
    print("|---|---|---|---|")
    for kind in kinds:
        per_round = ", ".join(f"{m:.2f}" for m in medians[kind])
        mid = statistics.median(medians[kind])
        print(f"| {kind} | {per_round} | {mid:.2f} | {mid / idle:.2f} |")


if __name__ == "__main__":
    main()
