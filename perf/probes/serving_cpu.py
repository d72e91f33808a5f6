"""Where the served path's CPU goes: bench_report's serving-overhead workload (demo model, 16 streams, 2 requests
each of 128 + 128 tokens, engine at 1 thread, `engine_cpus auto`: the engine's step thread on one CPU, tritonserver,
every other model thread and perf_analyzer on the other), the ensemble and tensorrt_llm direct, each run's CPU
seconds by process (summed over threads; the busiest threads listed) and by CPU, and the engine's steps (its
iteration counter on Triton's metrics port); and the in-process engine's steps and CPU seconds for the same work.
A measurement, not a test.

    .venv/bin/python perf/probes/serving_cpu.py [--repeats 2]   # needs `make perf-tools`
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import re
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_report as br  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402
from ensembles.stub_watch import STUB_BINARY  # noqa: E402

STREAMS, REQUESTS, TOKENS = 16, 32, 128


def thread_seconds(server_pid: int) -> dict[tuple[str, int], float]:
    """(process label, thread id) -> CPU seconds so far; a stub is labelled by its model's name."""
    out = {}
    server = psutil.Process(server_pid)
    for proc in [server, *server.children(recursive=True)]:
        cmd = proc.cmdline()
        stub = proc.name().startswith(STUB_BINARY[:15]) and len(cmd) > 1
        label = "tritonserver" if proc.pid == server_pid else Path(cmd[1]).parts[-3] if stub else proc.name()
        for thread in proc.threads():
            out[(label, thread.id)] = thread.user_time + thread.system_time
    return out


def by_process(before: dict, after: dict) -> dict[str, tuple[float, list[float]]]:
    """label -> (CPU seconds, the busiest threads' seconds) between two thread_seconds()."""
    spent: dict[str, list[float]] = {}
    for key, seconds in after.items():
        spent.setdefault(key[0], []).append(seconds - before.get(key, 0.0))
    return {label: (round(sum(s), 2), sorted((round(x, 2) for x in s if x > 0.05), reverse=True)[:3])
            for label, s in spent.items() if sum(s) > 0.01}


def iterations(server) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.opts.metrics_port}/metrics").read().decode()
    found = re.search(r'nv_trt_llm_general_metrics\{[^}]*general_type="iteration_counter"[^}]*\} (\S+)', text)
    return float(found.group(1))


def busy_seconds() -> list[float]:
    return [sum(t) - t.idle for t in psutil.cpu_times(percpu=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="the served model's stream_interval (new tokens per streamed response)")
    args = parser.parse_args()
    settings = argparse.Namespace(requests_per_stream=2, prompt_len=128, new_tokens=TOKENS, threads=1)
    torch.set_num_threads(1)
    br.OUT.mkdir(parents=True, exist_ok=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    work = br.Workload.from_heldout(tok, REQUESTS, settings.prompt_len)
    engine = br.warm_engine(model, tok, settings)
    server = br.start_server(model, False, br.OUT, 1, "auto", args.stream_interval)
    try:
        br.warm_server(server, tok)
        br.pin_process(server.opts.cpus)  # this process (the in-process engine, perf_analyzer) beside tritonserver
        for rep in range(args.repeats):
            steps, cpu = engine.stats().iteration_counter, time.process_time()
            m = br.in_process(engine, work, STREAMS, TOKENS, rep)
            print(f"in-process: {m.output_tok_s:.0f} tok/s, {engine.stats().iteration_counter - steps} steps, "
                  f"{time.process_time() - cpu:.2f} CPU s", flush=True)
        files = work.input_files(br.OUT, "cpu", TOKENS)
        for rep in range(args.repeats):
            for target in ("ensemble", "tensorrt_llm"):
                steps, threads, busy = iterations(server), thread_seconds(server.proc.pid), busy_seconds()
                m = br.served(target, server, STREAMS, files[target], REQUESTS, TOKENS, f"cpu_{target}_{rep}", rep)
                time.sleep(0.5)  # the metrics publish a moment later
                per_cpu = [round(b - a, 2) for a, b in zip(busy, busy_seconds())]
                print(f"{target}: {m.output_tok_s:.0f} tok/s, {iterations(server) - steps:.0f} steps, busy CPU s "
                      f"per CPU {per_cpu}, by process {by_process(threads, thread_seconds(server.proc.pid))}",
                      flush=True)
    finally:
        server.stop()
        engine.close()


if __name__ == "__main__":
    main()
