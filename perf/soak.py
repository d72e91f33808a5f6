"""Soak: the served demo model under twice its saturating load for a long time, with tenants, cancellations and
bad requests mixed in; every outcome must be explained, and memory and the KV cache must return to idle.

    .venv/bin/python perf/soak.py --duration-s 600 --clients 32 --out perf/SOAK.md
    .venv/bin/python perf/soak.py --duration-s 240 --rounds 4 --out perf/out/soak_rounds.md   # memory over rounds

Starts `python -m ensembles serve` (the launcher, as in production) on free ports with a limits file of three
tenants with API keys (premium; standard with max_concurrent 8; batch with 2 requests/s and max_concurrent 4), a
running batch of 16 (saturated by 16 streams; --clients 32 is twice that). Each client loops over: a stream as one
of the tenants (70 %), a stream it cancels after a few tokens (10 %), a bad request (10 %: max_tokens 0, or a key
nobody issued), a non-streamed request (10 %). Outcomes:
- served: the full response; refused: UNAVAILABLE "request refused" naming a limit (the tenants' limits at work);
- cancelled: the client cancelled it; bad: the INVALID_ARG the bad request deserves;
- failed: anything else (must be 0).
Reported: counts, p50/p99 latency of served requests, time to first token, RSS of tritonserver + model processes
and KV free blocks at idle before and after, and the load average (other users of the machine). With --rounds N the
load runs N times back to back on the same server, idle in between, and the RSS of each process at idle after each
round is reported: memory that settles is warm-up (the allocator and kernel caches keeping what a step once
needed); memory that keeps rising round after round is a leak.
Not a test: prints a table and writes a markdown report.
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests/ helpers start the server

from backend.policy.api_keys import key_hash, new_key  # noqa: E402
from ensembles import artifacts  # noqa: E402
from ensembles.render import RepoSpec, render  # noqa: E402
from tests.integration import metrics  # noqa: E402
from tests.integration.launcher import Launcher  # noqa: E402
from tests.integration.trtllm_direct import tensor  # noqa: E402

TENANTS = {"gold": 'tier = "premium"', "std": "max_concurrent = 8",
           "batchy": 'tier = "batch"\nrequests_per_s = 2\nrequest_burst = 4\nmax_concurrent = 4'}
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n", "class Stack:\n    def __init__(self", "for i in range(",
           "# Copyright 2001\n", "def walk(top, topdown=True):\n    "]
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
BATCH = 16  # the engine's running batch: 16 streams saturate it


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, latency: float | None = None, ttft: float | None = None, error: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if latency is not None:
                self.latencies.append(latency)
            if ttft is not None:
                self.ttfts.append(ttft)
            if outcome == "failed":
                self.unexplained.append(error[:300])


def _one(url: str, key: str, prompt: str, max_tokens: int, stream: bool, cancel_after: int | None) -> tuple:
    """(outcome, latency, ttft, error) of one request."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    inputs = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[stream]])}
    start, ttft, got = time.monotonic(), None, 0
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)),
                            headers={"authorization": f"Bearer {key}"})
        client.async_stream_infer("ensemble", [tensor(k, v) for k, v in inputs.items()],
                                  enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                return "error", None, None, str(error)
            got += 1
            ttft = ttft if ttft is not None else time.monotonic() - start
            if cancel_after is not None and got >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return "cancelled", None, None, ""
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "served", time.monotonic() - start, ttft, ""
    except queue.Empty:
        return "failed", None, None, "no response for 300 s"
    finally:
        client.stop_stream()
        client.close()


def _classify(kind: str, outcome: str, error: str) -> str:
    if outcome != "error":
        return outcome
    if "request refused" in error and "limit " in error:
        return "refused"
    if kind == "bad" and ("max_tokens must be > 0" in error or "unauthenticated: the API key" in error):
        return "bad"
    return "failed"


def client_loop(url: str, keys: dict[str, str], deadline: float, seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        kind = rng.choices(["stream", "cancel", "bad", "whole"], [70, 10, 10, 10])[0]
        tenant = rng.choices(list(keys), [5, 4, 3])[0]
        key, max_tokens, cancel_after = keys[tenant], rng.randint(16, 128), None
        if kind == "cancel":
            cancel_after = rng.randint(2, 6)
        elif kind == "bad":
            key, max_tokens = (new_key(), 8) if rng.random() < 0.5 else (key, 0)
        outcome, latency, ttft, error = _one(url, key, rng.choice(PROMPTS), max_tokens, kind != "whole",
                                             cancel_after)
        tally.add(_classify(kind, outcome, error), latency, ttft if kind != "whole" else None,
                  f"{kind} request as {tenant}: {error}")


def _process_label(proc: psutil.Process) -> str:
    """tritonserver, or the model a Python backend stub runs (its model.py path names the model's folder)."""
    for arg in proc.cmdline()[1:]:
        parts = Path(arg).parts
        if arg.endswith("model.py") and len(parts) >= 3:
            return parts[-3]
    return proc.name()


def _memory_by_process_mb(launcher: Launcher) -> dict[str, float]:
    """RSS (MiB) of tritonserver and each model process; several instances of one model add up."""
    server = launcher.server()
    rss: Counter = Counter()
    for proc in [server] + server.children(recursive=True):
        try:
            rss[_process_label(proc)] += proc.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
    return dict(rss)


def _idle_kv(launcher: Launcher, timeout_s: float = 60.0) -> tuple[float | None, float | None]:
    port = launcher.ports[2]
    total = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    free = metrics.wait_until(port, BLOCKS, lambda v: v == total, timeout_s, kv_cache_block_type="free")
    return free, total


def _round(launcher: Launcher, keys: dict[str, str], args: argparse.Namespace, tally: Tally, loads: list[float],
           seed: int) -> float:
    """One round of --clients clients for --duration-s against the running server; its wall time (s)."""
    deadline = time.monotonic() + args.duration_s
    threads = [threading.Thread(target=client_loop, args=(launcher.grpc_url, keys, deadline, seed + i, tally))
               for i in range(args.clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(15)
        loads.append(os.getloadavg()[0])
    return time.monotonic() - started


def _memory_table(memory: list[dict[str, float]]) -> str:
    """Per process, RSS at idle before the first round and after each round (MiB)."""
    names = sorted(set().union(*memory), key=lambda n: -memory[0].get(n, 0.0))  # a restarted process is new
    head = "| process | idle before | " + " | ".join(f"after round {i}" for i in range(1, len(memory))) + " |"
    lines = [head, "|---" * (len(memory) + 1) + "|"]
    for name in [*names, "total"]:
        values = [sum(m.values()) if name == "total" else m.get(name, 0.0) for m in memory]
        lines.append(f"| {name} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
    return "\n".join(lines)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of --duration-s each on one server")
    parser.add_argument("--out", type=Path, default=Path("perf/SOAK.md"))
    args = parser.parse_args()
    if args.rounds < 1 or args.clients < 1 or args.duration_s <= 0:
        parser.error("--rounds and --clients must be >= 1 and --duration-s > 0")
    root = Path(tempfile.mkdtemp(prefix="tritonllm-soak-"))
    keys = {tenant: new_key() for tenant in TENANTS}
    (root / "limits.toml").write_text("\n".join(f'[tenants.{t}]\napi_key_sha256 = ["{key_hash(keys[t])}"]\n{extra}\n'
                                                for t, extra in TENANTS.items()))
    demo = artifacts.demo()
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=BATCH,
                    max_input_len=512, max_seq_len=1024, limits_file=root / "limits.toml")
    launcher = Launcher(render(spec, root / "model_repository"), root / "launcher.log").start()
    try:
        load_before = os.getloadavg()
        idle_free, total = _idle_kv(launcher)
        memory = [_memory_by_process_mb(launcher)]  # idle before, then after each round
        tally, loads, elapsed, kv_free = Tally(), [], 0.0, []  # kv_free: idle free blocks after each round
        for r in range(args.rounds):
            elapsed += _round(launcher, keys, args, tally, loads, seed=r * args.clients)
            kv_free.append(_idle_kv(launcher)[0])
            memory.append(_memory_by_process_mb(launcher))
            print(f"round {r + 1}/{args.rounds}: {dict(tally.outcomes)}, RSS {sum(memory[-1].values()):.0f} MiB",
                  file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        launcher.teardown()
    mem_before, mem_after = sum(memory[0].values()), sum(memory[-1].values())
    rows = [("duration", f"{elapsed:.0f} s in {args.rounds} round(s), {args.clients} clients on a running batch of "
                         f"{BATCH} ({args.clients / BATCH:g}x saturation)"),
            *[(k, str(tally.outcomes[k])) for k in ("served", "refused", "cancelled", "bad", "failed")],
            ("served per second", f"{tally.outcomes['served'] / elapsed:.2f}"),
            ("latency p50 / p99 (served)", f"{_pct(tally.latencies, 50):.2f} s / {_pct(tally.latencies, 99):.2f} s"),
            ("TTFT p50 / p99 (streams)", f"{_pct(tally.ttfts, 50):.2f} s / {_pct(tally.ttfts, 99):.2f} s"),
            ("RSS server + model processes, idle before / after", f"{mem_before:.0f} MiB / {mem_after:.0f} MiB"),
            ("KV free blocks idle before / after each round (of total)",
             f"{idle_free:.0f} / {', '.join(f'{f:.0f}' for f in kv_free)} (of {total:.0f})"),
            ("load average before / during (median) / after",
             f"{load_before[0]:.2f} / {statistics.median(loads) if loads else float('nan'):.2f} / "
             f"{load_after[0]:.2f}")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    command = (f".venv/bin/python perf/soak.py --duration-s {args.duration_s:g} --clients {args.clients} "
               f"--rounds {args.rounds}")
    report = (f"# Soak run\n\n`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the machine: "
              f"{psutil.cpu_count()} cores, shared)\n\n| what | value |\n|---|---|\n{table}\n\n"
              f"RSS at idle (MiB), per process:\n\n{_memory_table(memory)}\n")
    if tally.unexplained:
        report += "\nUnexplained failures (first 10):\n\n" + "\n".join(f"- {e}" for e in tally.unexplained[:10]) + "\n"
    print(report)
    args.out.write_text(report)
    return 0 if not tally.unexplained and all(free == total for free in kv_free) else 1


if __name__ == "__main__":
    sys.exit(main())
