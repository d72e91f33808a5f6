"""The OpenAI API under load: aiperf (chat completions, streaming) against the front, beside perf_analyzer
(KServe gRPC streaming) against the ensemble itself, with the same prompts and output length, at 1, 4 and 16
concurrent requests, on one serving stack (tritonserver + the front, as `make serve`). The difference is what the
OpenAI front costs: HTTP + SSE + a gRPC hop per request. Writes perf/report/openai_bench.json and the
"OpenAI API (aiperf)" section of perf/REPORT.md; prints the table.

    bash perf/aiperf/setup.sh                     # once: aiperf 0.13.0 in perf/.venv-aiperf (~3 min)
    .venv/bin/python perf/openai_bench.py         # --concurrency 1 4 16 --isl 128 --osl 64

Prompts: aiperf's synthetic ones (--isl tokens of its corpus, counted by our tokenizer), sent as one user message;
perf_analyzer sends the same messages rendered by the model's chat template, so both paths prefill the same tokens.
Every request generates exactly --osl tokens (min_tokens = max_tokens; aiperf also sends ignore_eos). Prefix caching
is off. TTFT, inter-token latency (ITL) and output tokens/s are aiperf's own figures on the OpenAI path; on the
KServe path TTFT is first response - send and ITL = (last response - first response) / (osl - 1), per request.
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (transformers loads it)

# isort: split
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PERF = Path(__file__).resolve().parent
sys.path.insert(0, str(PERF / "perf_analyzer"))

import numpy as np  # noqa: E402
import sweep  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ensembles import artifacts  # noqa: E402
from ensembles.render import RepoSpec, render  # noqa: E402
from ensembles.server import ServerOptions, free_ports  # noqa: E402
from ensembles.stack import FrontOptions, ServingStack  # noqa: E402

OUT = PERF / "out" / "openai_bench"
AIPERF = Path(os.environ.get("AIPERF_VENV", PERF / ".venv-aiperf")) / "bin" / "aiperf"
REPORT, JSON_OUT = PERF / "REPORT.md", PERF / "report" / "openai_bench.json"
BEGIN, END = "<!-- openai-bench:begin -->", "<!-- openai-bench:end -->"


def start_stack(model: artifacts.ModelArtifacts) -> ServingStack:
    spec = RepoSpec(engine_dir=model.engine_dir, tokenizer_dir=model.tokenizer_dir, enable_kv_cache_reuse=False,
                    engine_threads=1, max_batch_size=16, max_input_len=1024, max_seq_len=2048, max_num_tokens=2048)
    http, grpc, metrics, front_http, openai_port = free_ports(5)
    front = FrontOptions(http_port=front_http, openai_port=openai_port, tokenizer_dir=model.tokenizer_dir)
    stack = ServingStack(ServerOptions(render(spec, OUT / "repo"), http, grpc, metrics), front, log_dir=OUT)
    return stack.start(ready_timeout_s=600, models=("ensemble",))


def run_aiperf(stack: ServingStack, tokenizer: Path, c: int, n: int, args) -> tuple[dict, Path]:
    out = OUT / f"aiperf_c{c}"
    cmd = [str(AIPERF), "profile", "--model", "ensemble", "--tokenizer", str(tokenizer),
           "--url", stack.openai_url.rsplit("/v1", 1)[0], "--endpoint-type", "chat", "--streaming",
           "--concurrency", str(c), "--request-count", str(n), "--warmup-request-count", str(c),
           "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl), "--osl-stddev", "0",
           "--extra-inputs", f"min_tokens:{args.osl}", "--extra-inputs", "ignore_eos:true",
           "--use-server-token-count", "--random-seed", "0", "--ui", "none", "--no-gpu-telemetry",
           "--no-server-metrics", "--artifact-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    (OUT / f"aiperf_c{c}.log").write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"aiperf failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    return {"concurrency": c, "requests": int(summary["request_count"]["avg"]),
            "ttft_p50_ms": summary["time_to_first_token"]["p50"], "ttft_p99_ms": summary["time_to_first_token"]["p99"],
            "itl_p50_ms": summary["inter_token_latency"]["p50"],
            "output_tok_s": summary["output_token_throughput"]["avg"],
            "errors": len(summary.get("error_summary") or []), "command": " ".join(cmd)}, out / "inputs.json"


def kserve_inputs(aiperf_inputs: Path, tokenizer, osl: int) -> Path:
    """perf_analyzer's input file: aiperf's messages rendered by the chat template, exactly osl new tokens."""
    data = []
    for session in json.loads(aiperf_inputs.read_text())["data"]:
        messages = session["payloads"][0]["messages"]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        data.append({"text_input": [prompt], "max_tokens": [osl], "min_tokens": [osl], "stream": [True]})
    path = OUT / "kserve_inputs.json"
    path.write_text(json.dumps({"data": data}))
    return path


def run_perf_analyzer(stack: ServingStack, data: Path, c: int, n: int, osl: int) -> dict:
    p = sweep.run_point("ensemble", stack.grpc_url, sweep.Load("concurrency", c), data, osl, OUT / "perf_analyzer",
                        request_count=n, tag=f"ensemble_c{c}")
    itl = [(lat - ttft) / (osl - 1) for lat, ttft in zip(p.latencies_ms, p.ttfts_ms)]
    return {"concurrency": c, "requests": p.requests, "ttft_p50_ms": p.ttft_p50_ms, "ttft_p99_ms": p.ttft_p99_ms,
            "itl_p50_ms": float(np.percentile(itl, 50)), "output_tok_s": p.output_tok_s}


def table(rows: list[tuple[dict, dict]]) -> str:
    head = ("| concurrent | TTFT p50 (ms) OpenAI / KServe | TTFT p99 (ms) OpenAI / KServe | ITL p50 (ms) OpenAI / "
            "KServe | output tok/s OpenAI / KServe | OpenAI / KServe throughput |\n|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {a['concurrency']} | {a['ttft_p50_ms']:.0f} / {k['ttft_p50_ms']:.0f} | {a['ttft_p99_ms']:.0f} / "
        f"{k['ttft_p99_ms']:.0f} | {a['itl_p50_ms']:.1f} / {k['itl_p50_ms']:.1f} | {a['output_tok_s']:.0f} / "
        f"{k['output_tok_s']:.0f} | **{a['output_tok_s'] / k['output_tok_s']:.2f}** |\n" for a, k in rows)


def section(result: dict) -> str:
    a0 = result["aiperf"][0]
    return "\n".join([
        BEGIN, "## OpenAI API (aiperf) beside the KServe API (perf_analyzer)", "",
        f"One run of `.venv/bin/python perf/openai_bench.py`, {result['date']}, {result['seconds']:.0f} s; load average "
        f"before / after: {result['load'][0]:.2f} / {result['load'][1]:.2f}. aiperf {result['aiperf_version']} "
        f"profiles `/v1/chat/completions` (streaming) on the front; perf_analyzer the ensemble over gRPC streaming, "
        f"same prompts ({result['isl']} tokens of aiperf's corpus in one user message, rendered by the chat "
        f"template), exactly {result['osl']} new tokens, prefix caching off, one stack. Raw numbers: "
        "[report/openai_bench.json](report/openai_bench.json). Both load generators share the server's cores: "
        "aiperf (Python, several processes) takes more CPU than perf_analyzer (C++), which weighs on the OpenAI "
        "column; the front itself adds an HTTP/SSE hop and a gRPC client per request."
        + (" The machine was busy with other jobs during this run (load average above 1.5 on 2 cores): the figures "
           "are noisy, compare the two columns rather than absolute numbers." if max(result["load"]) > 1.5 else ""),
        "",
        table(list(zip(result["aiperf"], result["perf_analyzer"]))),
        f"aiperf command (c = 1): `{a0['command'].replace(str(PERF.parent) + '/', '')}`", "", END, ""])


def write_report(result: dict) -> None:
    JSON_OUT.parent.mkdir(parents=True, exist_ok=True)
    JSON_OUT.write_text(json.dumps(result, indent=2) + "\n")
    text = REPORT.read_text()
    if BEGIN in text:
        text = text[: text.index(BEGIN)] + text[text.index(END) + len(END) + 1:]
    REPORT.write_text(text.rstrip("\n") + "\n\n" + section(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--render-only", action="store_true", help="rewrite REPORT.md from the last JSON")
    args = parser.parse_args()
    if args.render_only:
        write_report(json.loads(JSON_OUT.read_text()))
        return
    if not AIPERF.exists():
        subprocess.run(["bash", str(PERF / "aiperf" / "setup.sh")], check=True)
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    OUT.mkdir(parents=True, exist_ok=True)
    start, load_before = time.monotonic(), os.getloadavg()[0]
    stack = start_stack(model)
    try:
        runs = [run_aiperf(stack, model.tokenizer_dir, c, max(16, 4 * c), args) for c in args.concurrency]
        data = kserve_inputs(runs[-1][1], tok, args.osl)
        kserve = [run_perf_analyzer(stack, data, c, max(16, 4 * c), args.osl) for c in args.concurrency]
    finally:
        stack.stop()
    version = subprocess.run([str(AIPERF), "--version"], capture_output=True, text=True).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": time.monotonic() - start,
              "load": [load_before, os.getloadavg()[0]], "aiperf_version": version, "isl": args.isl, "osl": args.osl,
              "aiperf": [r for r, _ in runs], "perf_analyzer": kserve}
    write_report(result)
    print(table(list(zip(result["aiperf"], kserve))))


if __name__ == "__main__":
    main()
