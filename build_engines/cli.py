"""`python -m build_engines {demo,tokenizer,tiny,random,convert,shard}`: each prints the path it produced.

Progress and logs go to stderr; stdout carries only the resulting directory, so scripts
can do `HF=$(python -m build_engines demo)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .cache import default_cache_root
from .checkpoint_format import DTYPES


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    print(args.run(args))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m build_engines", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train (or find cached) the demo model; prints its HF dir")
    _add_cache(demo)
    demo.set_defaults(run=_demo)

    tok = sub.add_parser("tokenizer", help="train (or find cached) the demo tokenizer only")
    _add_cache(tok)
    tok.set_defaults(run=_tokenizer)

    tiny = sub.add_parser("tiny", help="random-init tiny Llama with the demo tokenizer")
    _add_random_model_args(tiny)
    tiny.set_defaults(run=_tiny)

    rand = sub.add_parser("random", help="random-init Llama of any size with the demo tokenizer")
    _add_random_model_args(rand)
    for dim in ("hidden", "layers", "heads", "kv-heads", "intermediate"):
        rand.add_argument(f"--{dim}", type=int, required=True)
    rand.set_defaults(run=_random)

    conv = sub.add_parser("convert", help="HF Llama dir -> TensorRT-LLM checkpoint dir")
    conv.add_argument("--hf", type=Path, required=True)
    conv.add_argument("--out", type=Path, required=True)
    conv.add_argument("--dtype", choices=DTYPES, default="float32")
    conv.set_defaults(run=_convert)

    shard = sub.add_parser("shard", help="TensorRT-LLM checkpoint dir -> tp x pp rank files (TRT-LLM's split rules)")
    shard.add_argument("src", type=Path, help="unsharded checkpoint dir (config.json + rank0.safetensors)")
    shard.add_argument("dst", type=Path, help="sharded checkpoint dir to write (replaced)")
    shard.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    shard.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    shard.set_defaults(run=_shard)
    return parser


def _add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", type=Path, default=None,
                   help=f"cache root (default: $TRITONLLM_CACHE or {default_cache_root()})")


def _add_random_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="HF model directory to write (replaced)")
    p.add_argument("--seed", type=int, default=0)
    _add_cache(p)  # where the tokenizer is found or trained


# Heavy imports (torch, transformers) happen inside the commands, so --help is instant.
def _demo(args: argparse.Namespace) -> Path:
    from .demo_model import build_demo_model
    return build_demo_model(args.cache)


def _tokenizer(args: argparse.Namespace) -> Path:
    from .tokenizer import build_tokenizer
    return build_tokenizer(args.cache)


def _tiny(args: argparse.Namespace) -> Path:
    from .random_model import make_tiny_random
    from .tokenizer import build_tokenizer
    return make_tiny_random(args.out, build_tokenizer(args.cache), seed=args.seed)


def _random(args: argparse.Namespace) -> Path:
    from .model_dims import LlamaDims
    from .random_model import make_random_model
    from .tokenizer import build_tokenizer
    dims = LlamaDims(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                     num_kv_heads=args.kv_heads, intermediate_size=args.intermediate)
    return make_random_model(args.out, build_tokenizer(args.cache), dims, seed=args.seed)


def _convert(args: argparse.Namespace) -> Path:
    from .convert import convert_hf_to_trtllm
    return convert_hf_to_trtllm(args.hf, args.out, args.dtype)


def _shard(args: argparse.Namespace) -> Path:
    from .shard import shard_checkpoint
    try:
        return shard_checkpoint(args.src, args.dst, args.tp, args.pp)
    except ValueError as exc:  # a model that cannot be split this way: the message says what would work
        raise SystemExit(f"error: {exc}") from None
