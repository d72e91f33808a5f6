"""Where our engine's greedy float32 tokens leave HF transformers' in a batch, and by how much the two candidates'
logits differed there: a near-tie (float summation order decides it) or a real error. For each linear kernel and
each row whose tokens differ, the first differing step's top-2 raw logits from HF's batched generate, from HF
running that row alone, and our top-2 log-probs (same gap as the logits: log-softmax shifts a row by one constant).
A diagnosis, not a test (issue 16: perf/ISSUE16.md).

    .venv/bin/python perf/greedy_divergence.py --hf perf/out/llama125m [--batch 16] [--new-tokens 32] [--threads 2]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import MAX_TOP_LOG_PROBS, SamplingParams
from backend.engine.sequence import Request
from build_engines.throughput import prompts
from ensembles import artifacts

TOP = MAX_TOP_LOG_PROBS  # our log-probs compared with HF's on this many tokens per step


def ours(engine_dir: Path, batch: list[list[int]], new_tokens: int, kernel: str, threads: int) -> list[list[tuple]]:
    """Per row, per step: (token, the TOP most likely ((id, log-prob), ...), highest first)."""
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=len(batch), device="cpu", num_threads=threads,
                                                linear_kernel=kernel))
    sampling = SamplingParams(max_tokens=new_tokens, num_top_log_probs=TOP)
    for i, p in enumerate(batch):
        engine.add_request(Request(str(i), tuple(p), sampling))
    rows: list[list[tuple]] = [[] for _ in batch]
    while engine.has_work():
        for o in engine.step():
            rows[int(o.request_id)].extend(zip(o.new_token_ids, o.new_top_log_probs))
    return rows


def hf(model, batch: list[list[int]], new_tokens: int) -> tuple[list[list[int]], torch.Tensor]:
    """HF greedy as perf/bench_side_by_side.py runs it: tokens (rows, steps) and raw logits (rows, steps, vocab)."""
    ids = torch.tensor(batch)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.eos_token_id,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits, dim=1)


def top2(logits: torch.Tensor) -> dict:
    """The two largest logits of one row (vocab,), their gap, and the gap relative to the row's scale."""
    values, ids = torch.topk(logits.double(), 2)
    gap = float(values[0] - values[1])
    return dict(ids=ids.tolist(), logits=[round(v, 6) for v in values.tolist()], gap=gap,
                gap_rel_max_abs=gap / float(logits.abs().max()), gap_rel_std=gap / float(logits.double().std()))


def deviation(mine: list[list[tuple]], ref: list[list[int]], ref_lp: torch.Tensor) -> float:
    """The float noise against a reference: the largest |our log-prob - the reference's| over the TOP tokens of
    every step whose prefix both share (each row up to and including its first differing step)."""
    worst = 0.0
    for r, (row, ref_row) in enumerate(zip(mine, ref)):
        for k, (token, top) in enumerate(row):
            worst = max(worst, max(abs(lp - float(ref_lp[r, k, i])) for i, lp in top))
            if token != ref_row[k]:
                break
    return worst


def as_rows(tokens: list[list[int]], logits: torch.Tensor) -> list[list[tuple]]:
    """HF's tokens and logits in the shape ours() returns."""
    values, ids = torch.topk(torch.log_softmax(logits.double(), dim=-1), TOP)
    return [[(t, tuple(zip(ids[r, k].tolist(), values[r, k].tolist()))) for k, t in enumerate(row)]
            for r, row in enumerate(tokens)]


def float64_logits(model, batch: list[list[int]], tokens: list[list[int]]) -> torch.Tensor:
    """A near-exact reference: logits (rows, steps, vocab) of a float64 copy of the model, teacher-forced on HF's
    float32 greedy tokens (one forward over prompt + tokens)."""
    ids = torch.tensor([p + t for p, t in zip(batch, tokens)])
    with torch.no_grad():
        logits = model.to(torch.float64)(ids).logits[:, len(batch[0]) - 1:-1]
    model.to(torch.float32)
    return logits


def diverging(kernel: str, mine: list[list[tuple]], ref: list[list[int]], ref_logits: torch.Tensor, model,
              batch: list[list[int]]) -> list[dict]:
    found = []
    for r, (row, ref_row) in enumerate(zip(mine, ref)):
        tokens = [t for t, _ in row]
        if tokens == ref_row:
            continue
        k = next(i for i, (a, b) in enumerate(zip(tokens, ref_row)) if a != b)
        _, alone_logits = hf(model, [batch[r] + ref_row[:k]], 1)  # the same prefix, HF without the batch
        found.append(dict(kernel=kernel, row=r, first_diff_step=k, ours_token=tokens[k], hf_token=ref_row[k],
                          hf_batched=top2(ref_logits[r, k]), hf_alone=top2(alone_logits[0, 0]),
                          ours=ours_top2(row[k])))
    return found


def ours_top2(step: tuple) -> dict:
    (a_id, a_lp), (b_id, b_lp) = step[1][:2]
    return dict(ids=[a_id, b_id], log_probs=[a_lp, b_lp], gap=a_lp - b_lp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, required=True, help="HF checkpoint dir (float32)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads, ours and HF alike")
    parser.add_argument("--kernels", nargs="+", default=["onednn", "torch"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine_dir = artifacts.from_hf(args.hf, dtype="float32").engine_dir
    batch = prompts(AutoTokenizer.from_pretrained(str(args.hf)), args.batch, args.prompt_len)
    model = AutoModelForCausalLM.from_pretrained(str(args.hf), dtype=torch.float32).eval()
    ref, ref_logits = hf(model, batch, args.new_tokens)
    exact_logits = float64_logits(model, batch, ref)
    exact = torch.log_softmax(exact_logits, dim=-1)
    print(json.dumps(dict(engine="hf", threads=args.threads, max_abs_log_prob_diff_vs_hf=0.0,
                          max_abs_log_prob_diff_vs_float64=deviation(as_rows(ref, ref_logits), ref, exact))))
    runs, spots = {}, set()
    for kernel in args.kernels:
        runs[kernel] = mine = ours(engine_dir, batch, args.new_tokens, kernel, args.threads)
        found = diverging(kernel, mine, ref, ref_logits, model, batch)
        ref_lp = torch.log_softmax(ref_logits.double(), dim=-1)
        print(json.dumps(dict(kernel=kernel, threads=args.threads, rows_equal=len(batch) - len(found),
                              rows=len(batch), max_abs_log_prob_diff_vs_hf=deviation(mine, ref, ref_lp),
                              max_abs_log_prob_diff_vs_float64=deviation(mine, ref, exact))), flush=True)
        for f in found:
            print(json.dumps(f), flush=True)
            spots.add((f["row"], f["first_diff_step"]))
    for r, k in sorted(spots):  # the float64 model's and every kernel's top 2 at each such step
        print(json.dumps(dict(engine="hf-float64", row=r, step=k, **top2(exact_logits[r, k]))), flush=True)
        for kernel, mine in runs.items():
            print(json.dumps(dict(kernel=kernel, row=r, step=k, ours=ours_top2(mine[r][k]))), flush=True)

if __name__ == "__main__":
    main()
