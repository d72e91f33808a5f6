"""Does a Python thread like the served model's send thread slow the engine through the GIL? The in-process engine
(demo model, 1 thread, 16 streams, closed loop) alone, then beside a thread that holds the GIL in pure Python for
--busy-us, --per-s times a second (sleeping otherwise), interleaved. A measurement, not a test.

    .venv/bin/python perf/probes/gil_probe.py --busy-us 75 --per-s 600 --rounds 3
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_report as br  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from backend.engine.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from ensembles import artifacts  # noqa: E402


def hold_gil(stop: threading.Event, busy_s: float, per_s: float) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < busy_s:  # pure Python: the GIL stays with this thread
            {"ids": [1, 2, 3], "final": False}.copy()
        time.sleep(max(0.0, 1.0 / per_s - busy_s))  # the sender's IPC wait: the GIL is released


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy-us", type=float, default=75.0)
    parser.add_argument("--per-s", type=float, default=600.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    engine = LLMEngine(model.engine_dir, EngineConfig(device="cpu", num_threads=1, **br.LIMITS))
    prompts = br.Workload.from_heldout(tok, 32, 128).ids
    br.closed_loop(engine, prompts[:2], 2, 8, tag="warm")
    results: dict[str, list[float]] = {"alone": [], "beside the thread": []}
    for r in range(args.rounds):
        for mode, runs in results.items():
            stop = threading.Event()
            holder = threading.Thread(target=hold_gil, args=(stop, args.busy_us * 1e-6, args.per_s), daemon=True)
            if mode != "alone":
                holder.start()
            runs.append(br.closed_loop(engine, prompts, 16, 128, tag=f"{r}{mode}-").output_tok_s)
            stop.set()
            if holder.is_alive():
                holder.join()
    for mode, runs in results.items():
        print(f"{mode}: {[round(x) for x in runs]} tok/s, median {statistics.median(runs):.0f}")


if __name__ == "__main__":
    main()
