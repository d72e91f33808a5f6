"""Where the ensemble's streamed responses wait: Triton's own statistics per composing model (executions, average
queue and compute time) over bench_report's serving-overhead workload at 16 streams (demo model, 2 requests a
stream of 128 + 128 tokens, engine at 1 thread, `engine_cpus auto`), each repeat with its tokens/s and TTFT p50.
A measurement, not a test. perf/ISSUE16.md: before the stream acks, postprocessing queued 270-316 ms on average.

    .venv/bin/python perf/probes/ensemble_queue.py [--repeats 4]   # needs `make perf-tools`
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_report as br  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")


def counters(url: str) -> dict[str, dict[str, tuple[int, int]]]:
    """model -> {queue, compute_infer}: (count, ns), Triton's cumulative inference statistics, and {executions}:
    (model executions, 0): fewer than its requests where the dynamic batcher handed several to one execute()."""
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(as_json=True)
    return {m["name"]: {"executions": (int(m.get("execution_count", 0)), 0),
                        **{k: (int(m["inference_stats"][k].get("count", 0)), int(m["inference_stats"][k].get("ns", 0)))
                           for k in ("queue", "compute_infer")}} for m in stats["model_stats"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    br.OUT.mkdir(parents=True, exist_ok=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    server = br.start_server(model, False, br.OUT, 1, "auto")
    try:
        br.warm_server(server, tok)
        br.pin_process(server.opts.cpus)  # perf_analyzer where tritonserver runs, as bench_report
        files = br.Workload.from_heldout(tok, 32, 128).input_files(br.OUT, "c16", 128)
        for rep in range(args.repeats):
            before = counters(server.grpc_url)
            m = br.served("ensemble", server, 16, files["ensemble"], 32, 128, f"queue_{rep}", rep)
            after = counters(server.grpc_url)
            line = f"repeat {rep}: {m.output_tok_s:.0f} tok/s, TTFT p50 {statistics.median(m.ttfts_ms):.0f} ms"
            for name in MODELS:
                (n, queue_ns), (_, compute_ns), (runs, _) = (
                    (after[name][k][0] - before[name][k][0], after[name][k][1] - before[name][k][1])
                    for k in ("queue", "compute_infer", "executions"))
                line += (f" | {name}: {n} requests in {runs} executions, queue {queue_ns / max(n, 1) / 1e6:.2f} ms, "
                         f"compute {compute_ns / max(n, 1) / 1e6:.2f} ms")
            print(line, flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
