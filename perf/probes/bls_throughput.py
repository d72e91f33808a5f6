"""Streamed tokens/s through tensorrt_llm_bls (the one-model BLS path) beside the ensemble, on one server: what the
BLS exclusion (backend/serving/bls_exclusion.py) costs a BLS caller's streams. bench_report's serving settings
(demo model, 128 + 128 tokens, 2 requests per stream, perf_analyzer over gRPC streaming); alternated per repeat.
A measurement, not a test.

    .venv/bin/python perf/probes/bls_throughput.py --concurrency 16 --repeats 3   # needs `make perf-tools`
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
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402

TARGETS = ("ensemble", "tensorrt_llm_bls")  # the same inputs (text_input, max_tokens, stream, ...)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    br.OUT.mkdir(parents=True, exist_ok=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    server = br.start_server(model, False, br.OUT, 1)
    c, tokens = args.concurrency, 128
    n = max(4, 2 * c)
    try:
        br.warm_server(server, tok)
        warm = br.Workload.from_heldout(tok, 2, 16, skip=600).input_files(br.OUT, "warm", 8)
        br.served("tensorrt_llm_bls", server, 2, warm["ensemble"], 2, 8, "warm_bls")
        data = br.Workload.from_heldout(tok, n, 128).input_files(br.OUT, f"bls_c{c}", tokens)["ensemble"]
        tok_s = {t: [] for t in TARGETS}
        for rep in range(args.repeats):
            for target in TARGETS:
                tok_s[target].append(br.served(target, server, c, data, n, tokens, f"bls_{target}_r{rep}",
                                               rep).output_tok_s)
    finally:
        server.stop()
    print(f"load average after: {os.getloadavg()}")
    for target, values in tok_s.items():
        print(f"{target}: {c} streams, tok/s per repeat {[round(v) for v in values]}, mean {statistics.mean(values):.0f}")


if __name__ == "__main__":
    main()
