"""The in-process sections of `make bench`: our engine vs HF transformers vs vLLM-CPU on two checkpoints, a batch-1
decode step against its memory-bandwidth floor, and time to first token of a long prompt, ours vs vLLM-CPU.

Issue 16's goals are measured here (perf/ISSUE16.md): 1.5x vLLM-CPU at batch 16, 1.2x at batch 1, a batch-1 step
within 1.3x of its floor, a long prompt's first token at least as early as vLLM-CPU's. Every engine gets every core.
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import bench_decode_floor
import bench_side_by_side
from transformers import AutoTokenizer

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.throughput import prompts
from ensembles import artifacts

PERF = Path(__file__).resolve().parent
# A ~125M Llama (116M parameters with the demo tokenizer's 8,192-token vocabulary), random-init: issue 16's second
# checkpoint. Built once into perf/out (git-ignored).
LLAMA125M = PERF / "out" / "llama125m"
LLAMA125M_DIMS = ("--hidden", "768", "--layers", "12", "--heads", "12", "--kv-heads", "4", "--intermediate", "3072")


def llama125m() -> Path:
    if not (LLAMA125M / "config.json").exists():
        subprocess.run([sys.executable, "-m", "build_engines", "random", "--out", str(LLAMA125M), *LLAMA125M_DIMS],
                       check=True)
    return LLAMA125M


# Issue 16 compares each engine in its fastest dtype on the machine: both are measured.
DTYPES = ("float32", "bfloat16")


def side_by_side(checkpoints: list[tuple[str, Path]], rounds: int, prompt_len: int, new_tokens: int,
                 vllm_timeout: float, with_vllm: bool) -> list[dict]:
    """bench_side_by_side's rounds (ours at every core and at 1 thread, HF, vLLM-CPU; each dtype; batch 1 and
    16)."""
    args = Namespace(sizes=[1, 16], ours_threads=[0, 1], prompt_len=prompt_len, new_tokens=new_tokens,
                     vllm_timeout=vllm_timeout, vllm=with_vllm)
    rows: list[dict] = []
    out = PERF / "out" / "bench_report"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "side_by_side.jsonl", "w") as log:
        for r in range(rounds):
            for name, hf_dir in checkpoints:
                for dtype in DTYPES:
                    bench_side_by_side.one_round(name, hf_dir, dtype, args, log, rows, r)
    return rows


def decode_floor(hf_dir: Path, steps: int) -> list[dict]:
    return [bench_decode_floor.measure(artifacts.from_hf(hf_dir, dtype).engine_dir, steps) for dtype in DTYPES]


def long_prompt_ttft(hf_dir: Path, prompt_len: int, repeats: int, vllm_timeout: float, with_vllm: bool) -> list[dict]:
    return [_long_prompt_ttft(hf_dir, dtype, prompt_len, repeats, vllm_timeout, with_vllm) for dtype in DTYPES]


def _long_prompt_ttft(hf_dir: Path, dtype: str, prompt_len: int, repeats: int, vllm_timeout: float,
                      with_vllm: bool) -> dict:
    """Seconds from submitting one prompt of `prompt_len` tokens to its first generated token (max_tokens 1, so the
    whole request is the prefill and one sampling), ours and vLLM-CPU's, `repeats` times each after a warm-up."""
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    [prompt] = prompts(tok, 1, prompt_len)
    model = artifacts.from_hf(hf_dir, dtype)
    # No prefix caching (the repeats send the same prompt; vLLM-CPU runs without it too); batch 2: the cache must
    # hold one whole sequence in whole blocks.
    engine = LLMEngine(model.engine_dir, EngineConfig(max_batch_size=2, max_input_len=prompt_len,
                                                      max_seq_len=prompt_len + 1, max_num_tokens=prompt_len,
                                                      enable_kv_cache_reuse=False, device="cpu"))
    ours = []
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            engine.generate([Request(f"ttft{i}", tuple(prompt), SamplingParams(max_tokens=1))])
            ours.append(time.perf_counter() - start)
    finally:
        engine.close()
    theirs = _vllm_ttft(hf_dir, dtype, prompt, repeats, vllm_timeout) if with_vllm else []
    return {"prompt_len": prompt_len, "dtype": dtype, "ours_s": ours[1:], "vllm_s": theirs,
            "load": os.getloadavg()[0]}


def _vllm_ttft(hf_dir: Path, dtype: str, prompt: list[int], repeats: int, timeout: float) -> list[float]:
    """vLLM-CPU's time for the same one-token request (bench_side_by_side.vllm: its own process and warm-up)."""
    rows = bench_side_by_side.vllm(hf_dir, [prompt], 1, dtype, [1], timeout, repeats=repeats)
    return [1.0 / row["tok_s"] for row in rows]  # one token generated: seconds = 1 / (tokens/s)
