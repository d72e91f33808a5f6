"""Held-out quality of the demo model (or any float checkpoint) quantized every way: perplexity on held-out stdlib
text (part 1 of the held-out split; calibration reads part 0) and top-1 next-token agreement with the float model,
all run by our torch runtime. Prints a table; writes perf/out/quant_quality.{json,md}.

    TRITONLLM_CACHE=.cache .venv/bin/python perf/quant_quality.py [--ckpt DIR --tokenizer DIR] [--group 128]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.model.loader import load_model  # noqa: E402
from build_engines.quantize.apply import calibrate, quantize_checkpoint  # noqa: E402
from build_engines.quantize.evaluate import evaluation_tokens, score_tokens  # noqa: E402

BUILDS = (("int8_wo", "none"), ("fp8", "none"), ("fp8", "fp8"), ("int4_rtn", "none"), ("int4_awq", "none"),
          ("int4_awq", "fp8"), ("none", "fp8"))


def main() -> None:
    args = _parser().parse_args()
    torch.set_num_threads(args.threads)
    if args.ckpt is None:
        from ensembles import artifacts
        demo = artifacts.demo()
        args.ckpt, args.tokenizer = demo.engine_dir, demo.tokenizer_dir
    out = Path(__file__).resolve().parent / "out"
    work = out / "quant_quality"
    start = time.perf_counter()
    stats = calibrate(args.ckpt, args.tokenizer, max_tokens=args.calib_tokens)
    print(f"calibration: {stats.num_tokens} tokens, {time.perf_counter() - start:.1f} s", file=sys.stderr)
    models, seconds = {}, {}
    for method, kv in BUILDS:
        start = time.perf_counter()
        q = quantize_checkpoint(args.ckpt, work / f"{method}-{kv}", method, kv, args.group, stats=stats,
                                progress=False)
        seconds[method, kv] = round(time.perf_counter() - start, 1)
        models[method, kv] = load_model(q, torch.device("cpu"))
    reference = load_model(args.ckpt, torch.device("cpu"))
    tokens = evaluation_tokens(args.tokenizer, max_tokens=args.eval_tokens)
    reports = score_tokens({"float": reference, **models}, tokens, args.seq_len, reference, progress=True)
    rows = [{"method": name[0] if isinstance(name, tuple) else name,
             "kv_cache": name[1] if isinstance(name, tuple) else "none", "quantize_s": seconds.get(name),
             **report.to_dict()} for name, report in reports.items()]
    table = _table(rows, args)
    print(table)
    out.mkdir(exist_ok=True)
    (out / "quant_quality.md").write_text(table + "\n")
    (out / "quant_quality.json").write_text(json.dumps(rows, indent=2) + "\n")


def _table(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"checkpoint {args.ckpt}; group {args.group}; calibration {args.calib_tokens} tokens; "
             f"evaluation {rows[0]['tokens']} tokens", "",
             "| weights | KV cache | perplexity | vs float | top-1 agreement with float |", "|---|---|---|---|---|"]
    for r in rows:
        inc, agree = f"{100 * r['perplexity_increase']:+.2f}%", f"{100 * r['top1_agreement']:.1f}%"
        lines.append(f"| {r['method']} | {r['kv_cache']} | {r['perplexity']:.3f} | {inc} | {agree} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", type=Path, default=None, help="float TRT-LLM checkpoint (default: the demo model)")
    p.add_argument("--tokenizer", type=Path, default=None, help="its tokenizer (HF dir)")
    p.add_argument("--group", type=int, default=128, help="INT4 group size")
    p.add_argument("--calib-tokens", type=int, default=8192)
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--seq-len", type=int, default=256, help="evaluation window")
    p.add_argument("--threads", type=int, default=2)
    return p


if __name__ == "__main__":
    main()
