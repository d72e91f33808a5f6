"""Served / in-process throughput at chosen concurrencies only: bench_report's serving-overhead section with its
settings (demo model, 128 + 128 tokens, engine at 1 thread in-process and served, perf_analyzer over gRPC
streaming), without the rest of `make bench`. A measurement, not a test.

    .venv/bin/python perf/probes/serving_ratio.py --concurrency 16 --repeats 3   # needs `make perf-tools`

--pin process puts the served engine's process (the tensorrt_llm stub, every thread) alone on CPU 0 and
tritonserver, the other stubs, perf_analyzer and this process (the in-process engine, run while the server idles) on
CPU 1; --pin thread puts only the stub's busiest thread after the warm-up (the engine loop's) on CPU 0;
--pin engine-only that thread alone, nothing else moved (these three from outside, by psutil, after the start).
--pin engine-cpus is what the product does (RepoSpec engine_cpus "auto": the engine's step thread pins itself,
tritonserver starts on the other CPU; backend/serving/cpu_placement.py).
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_report as br  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402
from ensembles.stub_watch import STUB_BINARY  # noqa: E402


def thread_times(pid: int) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def busiest_thread(process: psutil.Process, warm) -> int:
    """The thread of `process` that used the most CPU while `warm()` ran (the engine loop's, not the stub's main
    thread, which loaded the model)."""
    before = thread_times(process.pid)
    warm()
    after = thread_times(process.pid)
    return max(after, key=lambda tid: after[tid] - before.get(tid, 0.0))


def pin_engine_thread_only(server_pid: int, warm, engine_model: str = "tensorrt_llm") -> None:
    """Only the engine loop's thread on CPU 0; every other thread anywhere may run on both CPUs."""
    for child in psutil.Process(server_pid).children(recursive=True):
        cmdline = child.cmdline()
        stub = child.name().startswith(STUB_BINARY[:15]) and len(cmdline) > 1
        if stub and Path(cmdline[1]).parts[-3] == engine_model:
            busiest = busiest_thread(child, warm)
            os.sched_setaffinity(busiest, {0})
            print(f"pinned thread {busiest} of {engine_model} (pid {child.pid}) to CPU 0, nothing else",
                  file=sys.stderr)


def pin_server(server_pid: int, only_busiest_thread: bool, warm, engine_model: str = "tensorrt_llm") -> None:
    """The engine's stub (or only its busiest thread while `warm()` runs) on CPU 0; tritonserver, the other stubs
    and this process on CPU 1."""
    br.pin_process({1}, server_pid)
    br.pin_process({1})
    for child in psutil.Process(server_pid).children(recursive=True):
        cmdline = child.cmdline()
        if not child.name().startswith(STUB_BINARY[:15]) or len(cmdline) < 2:
            br.pin_process({1}, child.pid)
            continue
        alone = Path(cmdline[1]).parts[-3] == engine_model  # <repo>/<model>/<version>/model.py
        br.pin_process({1} if only_busiest_thread or not alone else {0}, child.pid)
        if alone and only_busiest_thread:
            busiest = busiest_thread(child, warm)
            os.sched_setaffinity(busiest, {0})
            print(f"pinned thread {busiest} of {engine_model} (pid {child.pid}) to CPU 0, the rest to CPU 1",
                  file=sys.stderr)
        else:
            print(f"pinned {Path(cmdline[1]).parts[-3]} (pid {child.pid}) to CPU {0 if alone else 1}",
                  file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests-per-stream", type=int, default=2, help="closed loop: requests each stream sends")
    parser.add_argument("--pin", choices=("process", "thread", "engine-only", "engine-cpus"),
                        help="where the served engine runs (module docstring)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="the served model's stream_interval (new tokens per streamed response)")
    args = parser.parse_args()
    args.prompt_len, args.new_tokens, args.threads = 128, 128, 1
    torch.set_num_threads(args.threads)
    br.OUT.mkdir(parents=True, exist_ok=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    engine = br.warm_engine(model, tok, args)
    server = br.start_server(model, False, br.OUT, args.threads, "auto" if args.pin == "engine-cpus" else "",
                             args.stream_interval)
    try:
        br.warm_server(server, tok)
        if args.pin == "engine-cpus":  # perf_analyzer and the in-process engine where tritonserver runs
            br.pin_process(server.opts.cpus)
        elif args.pin == "engine-only":
            pin_engine_thread_only(server.proc.pid, warm=lambda: br.warm_server(server, tok))
        elif args.pin in ("process", "thread"):
            pin_server(server.proc.pid, args.pin == "thread", warm=lambda: br.warm_server(server, tok))
        rows = br.overhead(server, engine, tok, args)
    finally:
        server.stop()
        engine.close()
    print(f"load average after: {os.getloadavg()}")
    for c in args.concurrency:
        tok_s = {s: [r.output_tok_s for r in rows if r.system == s and r.concurrency == c]
                 for s in ("engine", "ensemble", "tensorrt_llm")}
        base = statistics.mean(tok_s["engine"])
        print(f"{c} streams, tok/s per repeat: in-process {[round(x) for x in tok_s['engine']]}, ensemble "
              f"{[round(x) for x in tok_s['ensemble']]}, direct {[round(x) for x in tok_s['tensorrt_llm']]}; served / "
              f"in-process: ensemble {statistics.mean(tok_s['ensemble']) / base:.2f}, direct "
              f"{statistics.mean(tok_s['tensorrt_llm']) / base:.2f}")
        ttft = {s: [round(statistics.median(r.ttfts_ms)) for r in rows if r.system == s and r.concurrency == c]
                for s in ("engine", "ensemble", "tensorrt_llm")}
        print(f"{c} streams, TTFT p50 per repeat (ms): in-process {ttft['engine']}, ensemble {ttft['ensemble']}, "
              f"direct {ttft['tensorrt_llm']}")


if __name__ == "__main__":
    main()
