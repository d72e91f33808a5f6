"""perf_analyzer sweeps over gRPC streaming: the ensemble (text in, text out) or the tensorrt_llm model directly
(token ids), at several concurrencies or request rates; one perf_analyzer run per load point, its CSV report (-f)
and profile export (per-response timestamps) parsed into one table. Prints the table (markdown) and writes
OUT/sweep.{json,md} plus each point's raw files.

    perf/perf_analyzer/run.sh                                    # the ensemble at 1, 2, 4, 8, 16 streams
    .venv/bin/python perf/perf_analyzer/sweep.py --url localhost:8001 --target ensemble --concurrency 1 4 16
    .venv/bin/python perf/perf_analyzer/sweep.py --target tensorrt_llm --request-rate 1 2 4 --request-count 32

Every request generates exactly max_tokens tokens (the input data sets min_tokens = max_tokens), so output
tokens/s = completed requests x max_tokens / time. Time to first token is first response - send, from the
export. perf_analyzer is perf/tools/perf_analyzer (`make perf-tools`) unless --perf-analyzer says otherwise.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PERF_ANALYZER = HERE.parent / "tools" / "perf_analyzer"
INPUTS = {"ensemble": HERE / "ensemble_inputs.json", "tensorrt_llm": HERE / "tensorrt_llm_inputs.json"}
MAX_TOKENS_KEY = {"ensemble": "max_tokens", "tensorrt_llm": "request_output_len"}


@dataclass(frozen=True)
class Load:
    """One load point: `concurrency` streams kept busy, or `request_rate` requests/s sent open-loop."""

    mode: str  # "concurrency" | "request_rate"
    value: float

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "request_rate"):
            raise ValueError(f"mode must be concurrency or request_rate, got {self.mode!r}")
        if self.value <= 0:
            raise ValueError(f"{self.mode} must be > 0, got {self.value}")

    def args(self) -> list[str]:
        if self.mode == "concurrency":
            return ["--concurrency-range", str(int(self.value))]
        return ["--request-rate-range", f"{self.value:g}", "--request-distribution", "poisson"]


@dataclass(frozen=True)
class Point:
    """One load point's results (latencies in ms)."""

    target: str
    mode: str
    load: float
    requests: int
    throughput_req_s: float  # perf_analyzer's Inferences/Second
    output_tok_s: float  # completed requests x max_tokens / (last response - first send), from the export
    latency_p50_ms: float
    latency_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttfts_ms: tuple[float, ...]  # every request's, for distributions
    latencies_ms: tuple[float, ...]  # send to final response, every request's


def input_data(target: str, max_tokens: int, out_dir: Path) -> Path:
    """The committed input file, with its output length set to max_tokens (min_tokens too)."""
    data = json.loads(INPUTS[target].read_text())
    for entry in data["data"]:
        entry[MAX_TOKENS_KEY[target]] = [max_tokens]
        entry["min_tokens"] = [max_tokens]
    path = out_dir / f"{target}_inputs_{max_tokens}.json"
    path.write_text(json.dumps(data))
    return path


def command(target: str, url: str, load: Load, data: Path, csv_path: Path, export: Path, request_count: int,
            perf_analyzer: Path = PERF_ANALYZER, measurement_ms: int = 8000, warmup: bool = True) -> list[str]:
    """perf_analyzer over gRPC streaming. request_count > 0: exactly that many requests (after one warm-up request
    per stream at a concurrency, if `warmup`); 0: time windows of measurement_ms until stable (at most 3 trials)."""
    cmd = [str(perf_analyzer), "-m", target, "-u", url, "-i", "grpc", "--streaming", "--input-data", str(data),
           *load.args(), "-f", str(csv_path), "--profile-export-file", str(export), "--max-threads", "32"]
    if request_count > 0:
        cmd += ["--request-count", str(request_count)]
        # One warm-up request per stream; perf_analyzer 2.60 hangs with warm-up requests in request-rate mode.
        return cmd + (["--warmup-request-count", str(int(load.value))] if warmup and load.mode == "concurrency" else [])
    return cmd + ["--measurement-interval", str(measurement_ms), "--max-trials", "3", "-s", "50"]


def parse_csv(path: Path) -> dict[str, str]:
    """The first (only) row of perf_analyzer's -f report, by column name."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} holds no result row")
    return rows[0]


def parse_export(path: Path) -> list[tuple[int, list[int]]]:
    """(send timestamp ns, [response timestamps ns]) per request of the last experiment in the export."""
    experiments = json.loads(path.read_text())["experiments"]
    return [(r["timestamp"], r["response_timestamps"]) for r in experiments[-1]["requests"]]



def summarize(target: str, load: Load, row: dict[str, str], requests: list[tuple[int, list[int]]],
              max_tokens: int) -> Point:
    done = [(sent, resp) for sent, resp in requests if resp]
    if not done:
        raise RuntimeError("perf_analyzer recorded no completed request")
    ttfts = [(resp[0] - sent) / 1e6 for sent, resp in done]
    latencies = [(resp[-1] - sent) / 1e6 for sent, resp in done]
    span_s = (max(resp[-1] for _, resp in done) - min(sent for sent, _ in done)) / 1e9
    lat, first = np.percentile(latencies, [50, 99]), np.percentile(ttfts, [50, 99])
    return Point(target=target, mode=load.mode, load=load.value, requests=len(done),
                 throughput_req_s=float(row["Inferences/Second"]), output_tok_s=len(done) * max_tokens / span_s,
                 latency_p50_ms=float(lat[0]), latency_p99_ms=float(lat[1]), ttft_p50_ms=float(first[0]),
                 ttft_p99_ms=float(first[1]), ttfts_ms=tuple(ttfts), latencies_ms=tuple(latencies))


def run_point(target: str, url: str, load: Load, data: Path, max_tokens: int, out_dir: Path, request_count: int = 0,
              perf_analyzer: Path = PERF_ANALYZER, timeout_s: float = 600, tag: str = "", warmup: bool = True) -> Point:
    """Run perf_analyzer once at `load` with input file `data` (whose requests generate exactly max_tokens
    tokens); raise with its output when it fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = tag or f"{target}_{load.mode}_{load.value:g}"
    csv_path, export = out_dir / f"{tag}.csv", out_dir / f"{tag}_export.json"
    export.unlink(missing_ok=True)  # perf_analyzer refuses to overwrite an export
    cmd = command(target, url, load, data, csv_path, export, request_count, perf_analyzer, warmup=warmup)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    (out_dir / f"{tag}.log").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not csv_path.is_file():
        raise RuntimeError(f"perf_analyzer failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return summarize(target, load, parse_csv(csv_path), parse_export(export), max_tokens)


def table(points: list[Point]) -> str:
    head = ("| target | load | requests | req/s | output tok/s | latency p50 (ms) | latency p99 (ms) | "
            "TTFT p50 (ms) | TTFT p99 (ms) |\n|---|---|---|---|---|---|---|---|---|\n")
    unit = {"concurrency": "streams", "request_rate": "req/s"}
    return head + "".join(
        f"| {p.target} | {p.load:g} {unit[p.mode]} | {p.requests} | {p.throughput_req_s:.2f} | {p.output_tok_s:.1f} | "
        f"{p.latency_p50_ms:.0f} | {p.latency_p99_ms:.0f} | {p.ttft_p50_ms:.1f} | {p.ttft_p99_ms:.1f} |\n"
        for p in points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="localhost:8001", help="gRPC host:port of the server")
    parser.add_argument("--target", choices=sorted(INPUTS), default="ensemble")
    loads = parser.add_mutually_exclusive_group()
    loads.add_argument("--concurrency", type=int, nargs="+", help="streams kept busy (default 1 2 4 8 16)")
    loads.add_argument("--request-rate", type=float, nargs="+", help="requests/s, Poisson arrivals")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (exact)")
    parser.add_argument("--request-count", type=int, default=0,
                        help="requests per point (0: perf_analyzer's time windows until stable)")
    parser.add_argument("--out", type=Path, default=HERE.parent / "out" / "perf_analyzer")
    parser.add_argument("--perf-analyzer", type=Path, default=PERF_ANALYZER)
    args = parser.parse_args()
    if args.max_tokens < 1:
        parser.error("--max-tokens must be >= 1")
    if args.request_rate:
        points = [Load("request_rate", r) for r in args.request_rate]
    else:
        points = [Load("concurrency", c) for c in (args.concurrency or [1, 2, 4, 8, 16])]
    args.out.mkdir(parents=True, exist_ok=True)
    data = input_data(args.target, args.max_tokens, args.out)
    results = []
    for load in points:
        print(f"{args.target}: {load.mode} {load.value:g} ...", file=sys.stderr)
        results.append(run_point(args.target, args.url, load, data, args.max_tokens, args.out, args.request_count,
                                 args.perf_analyzer))
    text = table(results)
    print(text)
    (args.out / "sweep.md").write_text(text)
    (args.out / "sweep.json").write_text(json.dumps([asdict(p) for p in results], indent=1))


if __name__ == "__main__":
    main()
