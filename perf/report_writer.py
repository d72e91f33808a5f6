"""perf/REPORT.md and its plots from the numbers perf/bench_report.py measured (its bench_report.json)."""
from __future__ import annotations

import datetime
import statistics
from collections import defaultdict
from pathlib import Path

import bench_decode_floor
import bench_side_by_side
import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"engine": "engine in-process", "ensemble": "server: ensemble (gRPC stream)",
          "tensorrt_llm": "server: tensorrt_llm direct (gRPC stream)"}
GOAL = 0.9
BUSY = (" -- above half the cores before the run began (other processes, or this command's own set-up steps just "
        "before), so absolute numbers may be low and noisy; compare within a table, whose columns ran interleaved, "
        "one right after the other")



def by_load(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["system"], r["concurrency"])].append(r)
    return groups


def summary(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (system, concurrency): mean tok/s over repeats, its range, TTFT percentiles over all requests."""
    out = {}
    for key, reps in by_load(rows).items():
        tps = [r["output_tok_s"] for r in reps]
        ttfts = [t for r in reps for t in r["ttfts_ms"]]
        latencies = [t for r in reps for t in r["latencies_ms"]]
        out[key] = {"tok_s": statistics.mean(tps), "min": min(tps), "max": max(tps), "ttfts": ttfts,
                    "ttft_p50": np.percentile(ttfts, 50), "ttft_p99": np.percentile(ttfts, 99),
                    "latency_p50": np.percentile(latencies, 50)}
    return out


def overhead_table(s: dict, loads: list[int]) -> str:
    head = ("| streams | engine in-process (tok/s) | server: ensemble (tok/s) | ensemble / engine | "
            "server: tensorrt_llm direct (tok/s) | direct / engine | TTFT p50 engine / ensemble (ms) |\n"
            "|---|---|---|---|---|---|---|\n")
    lines = []
    for c in loads:
        e, ens, trt = s[("engine", c)], s[("ensemble", c)], s[("tensorrt_llm", c)]
        lines.append(f"| {c} | {e['tok_s']:.0f} ({e['min']:.0f}-{e['max']:.0f}) | {ens['tok_s']:.0f} "
                     f"({ens['min']:.0f}-{ens['max']:.0f}) | **{ens['tok_s'] / e['tok_s']:.2f}** | "
                     f"{trt['tok_s']:.0f} | {trt['tok_s'] / e['tok_s']:.2f} | "
                     f"{e['ttft_p50']:.0f} / {ens['ttft_p50']:.0f} |\n")
    return head + "".join(lines)


def plot_curves(s: dict, loads: list[int], path: Path) -> None:
    """Throughput vs time-to-first-token and vs per-request latency, one point per concurrency."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, name in ((axes[0], "ttft_p50", "TTFT p50"), (axes[1], "latency_p50", "request latency p50")):
        for system, label in LABELS.items():
            pts = [s[(system, c)] for c in loads]
            x = [p["tok_s"] for p in pts]
            ax.plot(x, [p[key] for p in pts], marker="o", label=label)
            for c, xi, p in zip(loads, x, pts):
                ax.annotate(str(c), (xi, p[key]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(xlabel="output tokens/s (points: concurrent streams)", ylabel=f"{name} (ms)", yscale="log",
               title=f"Throughput vs {name}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ttft(s: dict, loads: list[int], path: Path) -> None:
    """TTFT distributions (empirical CDFs) per system at each load."""
    fig, axes = plt.subplots(1, len(loads), figsize=(3.6 * len(loads), 3.4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, c in zip(axes, loads):
        for system, label in LABELS.items():
            values = sorted(s[(system, c)]["ttfts"])
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=label)
        ax.set(title=f"{c} stream{'s' if c > 1 else ''}", xlabel="TTFT (ms)", xscale="log")
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_prefix(ttfts: dict[str, list[float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for state, values in sorted(ttfts.items()):
        values = sorted(values)
        ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                label=f"prefix cache {state}")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", xscale="log", title="Shared prefix, 4 streams")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


ENGINES = (("ours", "ours, every core"), ("ours-1t", "ours, 1 thread"), ("hf", "HF transformers"),
           ("vllm", "vLLM-CPU"))


def engine_medians(rows: list[dict]) -> dict[tuple[str, int, str, str], float]:
    """(checkpoint, batch, engine, dtype) -> median output tok/s over the rounds (and vLLM's two runs a round)."""
    cells = defaultdict(list)
    for r in rows:
        cells[(r["checkpoint"], r["size"], r["engine"], r["dtype"])].append(r["tok_s"])
    return {k: statistics.median(v) for k, v in cells.items()}


def fastest(med: dict, checkpoint: str, size: int, engines: tuple[str, ...]) -> tuple[float, str]:
    """The best median of `engines` over the dtypes (issue 16: each engine in its fastest dtype), and that dtype."""
    cells = [(tok_s, dt) for (c, n, e, dt), tok_s in med.items() if (c, n) == (checkpoint, size) and e in engines]
    return max(cells, default=(0.0, "-"))


def plot_peers(rows: list[dict], path: Path) -> None:
    med = engine_medians(rows)
    groups = sorted({(c, dt, n) for c, n, _, dt in med})
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.2
    for i, (name, label) in enumerate(ENGINES):
        ax.bar([j + i * width for j in range(len(groups))], [med.get((c, n, name, dt), 0) for c, dt, n in groups],
               width, label=label)
    ax.set_xticks([j + 1.5 * width for j in range(len(groups))], [f"{c} {dt}\nbatch {n}" for c, dt, n in groups],
                  fontsize=7)
    ax.set(ylabel="output tokens/s (median)", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict, report: Path, plots: Path) -> None:
    s = summary(results["overhead"])
    loads = sorted({c for _, c in s})
    plot_curves(s, loads, plots / "throughput_vs_ttft.png")
    plot_ttft(s, [c for c in loads if c in (1, 4, 16)], plots / "ttft_distribution.png")
    plot_prefix(results["prefix_cache_ttft_ms"], plots / "prefix_cache_ttft.png")
    plot_peers(results["peers"]["side_by_side"], plots / "engines.png")
    report.write_text(render(results, s, loads, plots.relative_to(report.parent)))


def _loads(load: dict) -> str:
    return " / ".join(f"{load[k][0]:.2f}" for k in ("before", "after_overhead", "after") if k in load)


def _vllm(value: float | None, tried: bool) -> str:
    if value is None:
        return "failed to run (its stderr is in the run's log)" if tried else "not installed (perf/peers/setup_vllm.sh)"
    return f"{value:.0f}"


def render(results: dict, s: dict, loads: list[int], plots: Path) -> str:
    m, top = results["machine"], max(loads)
    ratio = s[("ensemble", top)]["tok_s"] / s[("engine", top)]["tok_s"]
    load = results["loadavg"]
    busy = load["before"][0] > 0.5 * m["nproc"]  # later samples include this run's own server and client
    return _overhead_part(results, s, loads, plots, ratio, busy) + _comparison_part(results, plots)


def _placement(placement: dict | None) -> str:
    if placement is None:
        return ("No CPU placement: on 2 cores the served engine shares them with Triton, the pre/postprocessing models "
                "and the load generator.")
    cpus = lambda key: ", ".join(str(c) for c in placement[key])  # noqa: E731
    return (f"Servers rendered with `engine_cpus` (docs/operations.md): the engine's step thread alone on CPU "
            f"{cpus('engine')}; tritonserver, every other model thread, perf_analyzer and the in-process engine on CPU "
            f"{cpus('rest')}.")


def _overhead_part(results: dict, s: dict, loads: list[int], plots: Path, ratio: float, busy: bool) -> str:
    m, a, top, load = results["machine"], results["args"], max(loads), results["loadavg"]
    direct = s[("tensorrt_llm", top)]["tok_s"] / s[("engine", top)]["tok_s"]
    return f"""# tritonllm benchmark report

One run of `make bench` (`{results['command']}`), {datetime.date.today()}, {results['elapsed_s']} s.
Machine: {m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB, no GPU; Python {m['python']}, torch {m['torch']}
(torch threads: {m['torch_threads']}). Load average (1 min) before / after the serving-overhead runs / at the end:
{_loads(load)}{BUSY if busy else ''}.
Every number below comes from this run; raw numbers: [report/bench_report.json](report/bench_report.json).

Workload: the demo model (float32, greedy), prompts of {a['prompt_len']} tokens cut from held-out standard-library
source, exactly {a['new_tokens']} new tokens per request (min_tokens = max_tokens), closed loop: N streams each
sending its next request when the last one finished, {a['requests_per_stream']} requests per stream (at least 4), all
streams starting at once, {a['repeats']} repeats alternating engine / ensemble / tensorrt_llm. Served side:
tritonserver with prefix caching off, driven by perf_analyzer over gRPC streaming on the same machine; throughput =
requests x new tokens / (last response - first send), the same definition in-process. The engine runs
{a['threads']} torch thread(s) in-process and in the server alike (HF transformers too; vLLM-CPU binds its own
OpenMP threads to every core). {_placement(results.get('placement'))}

## Serving overhead

**Throughput through Triton at {top} concurrent streams / the engine's in-process throughput at the same load:
ensemble {ratio:.2f}, tensorrt_llm direct {direct:.2f}** (goal: at least {GOAL} for both; {'met' if min(ratio, direct) >= GOAL else 'not met'}).

{overhead_table(s, loads)}
Tokens/s are the mean over repeats (range in brackets). "tensorrt_llm direct" sends token ids to the engine's
Triton model without the preprocessing / postprocessing models (tensorrtllm_backend's direct path), separating
the cost of Triton + gRPC from that of tokenizing and detokenizing every streamed token in the ensemble.

![throughput vs TTFT]({plots}/throughput_vs_ttft.png)

![TTFT distributions]({plots}/ttft_distribution.png)

"""


def _peers_part(peers: dict, a: dict, tried: bool, plots: Path) -> str:
    """Issue 16's in-process goals: the side-by-side table, the batch-1 floor, a long prompt's first token."""
    rows, floors, ttfts = peers["side_by_side"], peers["decode_floor"], peers["long_prompt_ttft"]
    med = engine_medians(rows)
    goals = []
    for (ck, n) in sorted({(c, k) for c, k, _, _ in med}):
        (ours, ours_dt), (vllm, vllm_dt) = fastest(med, ck, n, ("ours", "ours-1t")), fastest(med, ck, n, ("vllm",))
        target = 1.5 if n >= 16 else 1.2
        if vllm:
            verdict = "met" if ours >= target * vllm else "missed"
            goals.append(f"{ck} batch {n}: {ours / vllm:.2f}x (ours {ours_dt} / vLLM {vllm_dt}; goal {target}x: "
                         f"{verdict})")
    same = [r["equal_to_hf"] for r in rows if "equal_to_hf" in r and r["dtype"] == "float32"]
    return f"""Output tokens/s, greedy, float32 and bfloat16 checkpoints, one static batch ({a['prompt_len']}-token prompts cut from held-out
standard-library source, {a['new_tokens']} new tokens), {a['rounds']} rounds interleaved engine by engine
(perf/bench_peers.py over perf/bench_side_by_side.py); ranges over rounds (vLLM-CPU runs twice a round in its
process); "ours / vLLM" = ours at every core against vLLM's range. Checkpoints: the demo model and a random-init
Llama of 116M parameters (hidden 768, 12 layers, 12 heads / 4 KV heads, intermediate 3072, the demo tokenizer).

{bench_side_by_side.table(rows)}
Best of ours (either thread count, either dtype) / best of vLLM-CPU (either dtype), medians (issue 16's goals: 1.5x
at batch 16, 1.2x at batch 1, each engine in its fastest dtype): {'; '.join(goals) or 'vLLM-CPU ' + _vllm(None, tried)}.
Ours runs a bfloat16 checkpoint with bf16 linears beside float32 activations where the CPU has native bf16, and as
a float32 model of its exact weights where it has not (docs/operations.md, `linear_dtype`); bfloat16 rows are
checked by log-prob closeness in the tests, not here.
Float32 greedy tokens of ours equal HF's in {sum(same)} of {len(same)} runs (where they differ, perf/ISSUE16.md shows
the 125M model's batch-16 row 3: a float32 near-tie that a float64 reference decides for ours).

![engines]({plots}/engines.png)

Batch-1 decode step of the 125M model against its memory-bandwidth floor (weights read once per step / the faster
of a one-thread copy and a read on every core; {len(floors[0]['rounds'])} rounds of {bench_decode_floor.ROUND_STEPS}
steps, each followed by the rates it is compared with, since this VM's read rate moves between two levels; medians
over rounds; every core, linear kernel {floors[0]['linear_kernel']}; goal 1.3x):

{bench_decode_floor.table(floors)}
Time to first token of one {ttfts[0]['prompt_len']}-token prompt on the 125M model (max_tokens 1: prefill + one
token; median of {len(ttfts[0]['ours_s'])} after a warm-up, every core; goal: ours in its fastest dtype at most
vLLM-CPU's in its fastest): {_ttft_line(ttfts, tried)}.
"""


def _ttft_line(ttfts: list[dict], tried: bool) -> str:
    ours = {t["dtype"]: statistics.median(t["ours_s"]) for t in ttfts}
    vllm = {t["dtype"]: statistics.median(t["vllm_s"]) for t in ttfts if t["vllm_s"]}
    cells = "; ".join(f"{dt}: ours {s * 1e3:.0f} ms, vLLM-CPU " + (f"{vllm[dt] * 1e3:.0f} ms" if dt in vllm else "-")
                      for dt, s in ours.items())
    if not vllm:
        return f"{cells} (vLLM-CPU {_vllm(None, tried)})"
    best_ours, best_vllm = min(ours.values()), min(vllm.values())
    return (f"{cells}; fastest ours / fastest vLLM-CPU {best_ours / best_vllm:.2f} "
            f"({'met' if best_ours <= best_vllm else 'missed'})")


def _comparison_part(results: dict, plots: Path) -> str:
    a, pfx = results["args"], results["prefix_cache_ttft_ms"]
    tried = a["vllm"] == "True"
    peers = results["peers"]
    weights_rows = "\n".join(f"| {name} | {tok_s:.0f} |" for name, tok_s in results["dtypes"].items())
    return f"""## Our engine vs HF transformers vs vLLM-CPU (in-process, every core)

{_peers_part(peers, a, tried, plots)}
## Prefix cache on vs off (through the server)

24 requests sharing a {a['prefix_len']}-token prefix, each with its own 16-token suffix, 8 new tokens, 4 streams
(perf_analyzer), on two servers that differ only in `enable_kv_cache_reuse`.

| prefix cache | TTFT p50 (ms) | TTFT p90 (ms) |
|---|---|---|
| off | {np.percentile(pfx['off'], 50):.0f} | {np.percentile(pfx['off'], 90):.0f} |
| on | {np.percentile(pfx['on'], 50):.0f} | {np.percentile(pfx['on'], 90):.0f} |

![prefix cache]({plots}/prefix_cache_ttft.png)

## Weights: float32 vs bfloat16 vs quantized builds

Engine in-process, 16 streams, closed loop; quantized builds made from the bfloat16 checkpoint by
`build_engines.quantize` (calibrated on held-out text; quality in docs/quantization.md). On CPU the INT4 / INT8
kernels serve decode-sized inputs only and FP8 has no GEMM: they save weight memory, not time (docs/quantization.md).

| weights | output tok/s |
|---|---|
{weights_rows}

## Reproduce

```sh
make perf-tools   # perf_analyzer (PyPI wheel) runnable on Debian 12: perf/tools/setup_perf_analyzer.sh
make bench        # this report; bash perf/peers/setup_vllm.sh first to include vLLM-CPU
```
"""
