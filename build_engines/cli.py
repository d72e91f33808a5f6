"""`python -m build_engines {build,demo,tokenizer,tiny,random,family,convert,shard,plan-families}`: each prints the
path it produced (plan-families: a markdown table).

Progress and logs go to stderr; stdout carries only the resulting directory, so scripts
can do `HF=$(python -m build_engines demo)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from backend.formats.checkpoint import DTYPES
from build_engines.cache import default_cache_root


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    print(args.run(args))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m build_engines", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bld = sub.add_parser("build", help="run build specs (YAML/TOML): convert, plan, quantize, shard, verify, install")
    bld.add_argument("specs", type=Path, nargs="+", metavar="SPEC", help="build spec file(s), built in order")
    bld.add_argument("--model-repository", type=Path, default=None,
                     help="install each build as a new version of tensorrt_llm in this rendered repository "
                          "(overrides the spec's model_repository)")
    bld.add_argument("--summary", type=Path, default=None,
                     help="also write the builds side by side to this markdown file (and .json beside it)")
    bld.set_defaults(run=_build)

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

    fam = sub.add_parser("family", help="random-init tiny checkpoint of a family's structure (family_fixtures.py)")
    fam.add_argument("name", help="fixture name: llama2, llama3, mistral, qwen2, qwen3, gemma2, phi3_128k, ...")
    _add_random_model_args(fam)
    fam.set_defaults(run=_family)

    plans = sub.add_parser("plan-families", help="memory plans of released checkpoints (real_configs.py): weights "
                                                 "per rank, KV per token, what fits, per quantization and TP size")
    plans.add_argument("--device-memory-gib", type=float, default=24.0)
    plans.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    plans.set_defaults(run=_plan_families)

    conv = sub.add_parser("convert", help="HF checkpoint dir (Llama, Mistral, Qwen2/3, Gemma 2, Phi-3) -> "
                                          "TensorRT-LLM checkpoint dir")
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
def _build(args: argparse.Namespace) -> str:
    import json
    import sys

    from build_engines.build import BuildStopped, build
    from build_engines.report import summary_markdown
    from build_engines.spec import BuildSpec, SpecError

    try:
        specs = [BuildSpec.load(path) for path in args.specs]  # every spec is checked before the first build
        reports = [build(spec, args.model_repository, say=lambda m: print(m, file=sys.stderr)) for spec in specs]
    except (SpecError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    except BuildStopped as exc:
        raise SystemExit(str(exc)) from None
    if args.summary:
        dicts = [r.to_dict() for r in reports]
        args.summary.write_text(summary_markdown(dicts))
        args.summary.with_suffix(".json").write_text(json.dumps(dicts, indent=2) + "\n")
    return "\n".join(str(spec.build_dir / "report.md") for spec in specs)


def _demo(args: argparse.Namespace) -> Path:
    from build_engines.demo_model import build_demo_model
    return build_demo_model(args.cache)


def _tokenizer(args: argparse.Namespace) -> Path:
    from build_engines.tokenizer import build_tokenizer
    return build_tokenizer(args.cache)


def _tiny(args: argparse.Namespace) -> Path:
    from build_engines.random_model import make_tiny_random
    from build_engines.tokenizer import build_tokenizer
    return make_tiny_random(args.out, build_tokenizer(args.cache), seed=args.seed)


def _random(args: argparse.Namespace) -> Path:
    from build_engines.model_dims import LlamaDims
    from build_engines.random_model import make_random_model
    from build_engines.tokenizer import build_tokenizer
    dims = LlamaDims(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                     num_kv_heads=args.kv_heads, intermediate_size=args.intermediate)
    return make_random_model(args.out, build_tokenizer(args.cache), dims, seed=args.seed)


def _family(args: argparse.Namespace) -> Path:
    from build_engines.family_fixtures import FIXTURES, make_fixture
    from build_engines.tokenizer import build_tokenizer
    if args.name not in FIXTURES:
        raise SystemExit(f"error: no fixture {args.name!r}; choose one of {sorted(FIXTURES)}")
    return make_fixture(args.name, args.out, build_tokenizer(args.cache), seed=args.seed)


def _plan_families(args: argparse.Namespace) -> str:
    from build_engines.real_configs import plan_table
    return plan_table(args.device_memory_gib, tuple(args.tp))


def _convert(args: argparse.Namespace) -> Path:
    from build_engines.convert import convert_hf_to_trtllm
    return convert_hf_to_trtllm(args.hf, args.out, args.dtype)


def _shard(args: argparse.Namespace) -> Path:
    from build_engines.shard import shard_checkpoint
    try:
        return shard_checkpoint(args.src, args.dst, args.tp, args.pp)
    except ValueError as exc:  # a model that cannot be split this way: the message says what would work
        raise SystemExit(f"error: {exc}") from None
