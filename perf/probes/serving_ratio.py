"""Served / in-process throughput at chosen concurrencies only: bench_report's serving-overhead section with its
settings (demo model, 128 + 128 tokens, engine at 1 thread in-process and served, perf_analyzer over gRPC
streaming), without the rest of `make bench`. A measurement, not a test.

    .venv/bin/python perf/probes/serving_ratio.py --concurrency 16 --repeats 3   # needs `make perf-tools`
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
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.requests_per_stream, args.prompt_len, args.new_tokens, args.threads = 2, 128, 128, 1
    torch.set_num_threads(args.threads)
    br.OUT.mkdir(parents=True, exist_ok=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    engine = br.warm_engine(model, tok, args)
    server = br.start_server(model, False, br.OUT, args.threads)
    try:
        br.warm_server(server, tok)
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


if __name__ == "__main__":
    main()
