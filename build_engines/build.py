"""The build pipeline: one spec -> a verified, quantized, sharded artifact installed as a new model version.

    convert (HF -> TRT-LLM checkpoint, spec dtype) -> memory plan (refuse what cannot fit) -> calibrate/quantize
    -> shard (tp x pp) -> verify (perplexity, top-1 agreement, ONNX layer check, tokens/s)
    -> trtllm-build (target tensorrt_llm) -> install as a model version -> report (JSON + markdown)

Everything lands in spec.output_dir / spec.name:
    checkpoint-<dtype>/   unquantized, single rank        reference-float32/   what verification compares with
    checkpoint-quantized/ (when quantizing)                checkpoint/          the sharded artifact (torch target)
    engine/               trtllm-build's output (tensorrt_llm target)           verify/  ONNX layer + polygraphy JSON
    report.json, report.md
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from build_engines.report import BuildReport, Throughput, Verification, dir_bytes
from build_engines.spec import DEMO_SOURCE, BuildSpec, SpecError


class BuildStopped(RuntimeError):
    """The build stopped before a step that cannot run here; the report written so far says what was done."""


def build(spec: BuildSpec, model_repository: Path | None = None, say: Callable[[str], None] = print) -> BuildReport:
    """Run the pipeline; returns the report (also written to build_dir/report.{json,md})."""
    from build_engines.convert import checkpoint_config_from_hf
    from build_engines.plan import plan_memory

    repo = Path(model_repository) if model_repository else spec.model_repository
    if repo is not None:
        _check_install_target(repo, spec.version)
    hf_dir = resolve_source(spec.source)
    checkpoint_config = checkpoint_config_from_hf(hf_dir, spec.dtype)
    plan = plan_memory(checkpoint_config, spec)  # refuses before anything is built
    if spec.target == "tensorrt_llm":
        from build_engines.trtllm_target import check_buildable

        check_buildable(checkpoint_config, spec)
    say(plan.describe())
    trtllm_problem = _trtllm_problem(spec)
    if trtllm_problem:
        say(f"note: the build will stop before trtllm-build: {trtllm_problem}")
    out = spec.build_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = BuildReport.start(spec, hf_dir, plan, out)
    unquantized, single_rank, artifact = _checkpoints(spec, hf_dir, out, report)
    report.sizes = {"hf_source_bytes": dir_bytes(hf_dir, "*.safetensors"),
                    f"checkpoint_{spec.dtype}_bytes": dir_bytes(unquantized, "rank*.safetensors"),
                    "artifact_bytes": dir_bytes(artifact, "rank*.safetensors")}
    with report.stage("verify"):
        report.verification = verify_build(spec, hf_dir, artifact, single_rank, out, say)
    served = artifact
    if spec.target == "tensorrt_llm":
        from build_engines.trtllm_target import run_trtllm_build, trtllm_build_argv

        report.trtllm_build_argv = trtllm_build_argv(spec, artifact, out / "engine")
        if trtllm_problem:
            report.status = f"stopped before trtllm-build: {trtllm_problem}"
            report.write()
            raise BuildStopped(f"{report.status}\n(the checkpoint, its verification and the trtllm-build command "
                               f"it would run are in {out / 'report.md'})")
        with report.stage("trtllm-build"):
            served = run_trtllm_build(report.trtllm_build_argv, out / "trtllm-build.log")
        report.sizes["engine_bytes"] = dir_bytes(served, "rank*.engine")
    if repo is not None:
        from backend.formats.versions import install_version

        with report.stage("install"):
            report.installed_version = install_version(repo, served, spec.version, meta=report.summary())
            report.model_repository = str(Path(repo).resolve())
        say(f"installed as version {report.installed_version} of tensorrt_llm in {repo}")
    report.status = "ok"
    report.write()
    say(f"report: {out / 'report.md'}")
    return report


def _checkpoints(spec: BuildSpec, hf_dir: Path, out: Path, report: BuildReport) -> tuple[Path, Path, Path]:
    """(unquantized single-rank, quantized single-rank (the same without quantization), sharded artifact)."""
    from build_engines.convert import convert_hf_to_trtllm
    from build_engines.shard import shard_checkpoint

    with report.stage("convert"):
        unquantized = convert_hf_to_trtllm(hf_dir, out / f"checkpoint-{spec.dtype}", spec.dtype)
    single_rank = unquantized
    if spec.quant_algo or spec.kv_cache_quant_algo:
        from build_engines.quantize.apply import quantize_checkpoint

        with report.stage("calibrate+quantize"):
            single_rank = quantize_checkpoint(unquantized, out / "checkpoint-quantized", spec.quantization,
                                              kv_cache=spec.kv_cache, group_size=spec.group_size,
                                              tokenizer_dir=hf_dir, max_calib_tokens=spec.calib_tokens, progress=True)
    with report.stage("shard"):
        artifact = shard_checkpoint(single_rank, out / "checkpoint", spec.tp_size, spec.pp_size)
    return unquantized, single_rank, artifact


def _check_install_target(repo: Path, version: int | None) -> None:
    """Refuse, before building, an install that would fail: no such repository, or the version is taken."""
    from backend.formats.versions import LLM_MODEL, list_versions

    try:
        versions = list_versions(repo)
    except ValueError as exc:
        raise SpecError(f"model repository: {exc}; render one first (python -m ensembles render)") from None
    if version in versions:
        raise SpecError(f"version {version} of {LLM_MODEL} already exists in {repo}: choose another version, or "
                        f"leave it out for the next free one ({max(versions) + 1})")


def resolve_source(source: str) -> Path:
    """The HF checkpoint dir a spec names; `demo` trains (or finds cached) the demo model."""
    if source == DEMO_SOURCE:
        from build_engines.demo_model import build_demo_model

        return build_demo_model(None)
    path = Path(source)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"source {path} is not a HF checkpoint directory (no config.json); "
                                f"name a directory written by save_pretrained, or `demo`")
    return path


def verify_build(spec: BuildSpec, hf_dir: Path, artifact: Path, single_rank: Path, out: Path,
                 say: Callable[[str], None]) -> Verification:
    """Perplexity and top-1 agreement against the float32 unquantized model; sharded builds served and compared
    with the single-rank checkpoint; the ONNX layer check; tokens/s."""
    from build_engines.convert import convert_hf_to_trtllm
    from build_engines.quantize.evaluate import evaluate_quality, evaluation_tokens
    from build_engines.verify import check_layer_onnx, check_sharded

    v = spec.verify
    reference = convert_hf_to_trtllm(hf_dir, out / "reference-float32", "float32")
    quality = evaluate_quality(single_rank, hf_dir, reference, max_tokens=v.eval_tokens, seq_len=v.seq_len,
                               progress=True)
    result = Verification(quality=quality.to_dict(), seq_len=v.seq_len, reference="float32, unquantized")
    say(f"verify: perplexity {quality.perplexity:.3f} (reference {quality.reference_perplexity:.3f}), "
        f"top-1 agreement {quality.top1_agreement:.4f}")
    if spec.world_size > 1:
        ids = evaluation_tokens(hf_dir, max_tokens=v.shard_check_prompts * v.prompt_len).tolist()
        prompts = [ids[i * v.prompt_len : (i + 1) * v.prompt_len] for i in range(v.shard_check_prompts)]
        result.shard_check = check_sharded(artifact, single_rank, prompts, v.shard_check_tokens)
        say(f"verify: sharded engine greedy tokens equal to the single-rank checkpoint's: "
            f"{result.shard_check.equal}/{result.shard_check.tokens}")
    if v.onnx_layer:
        result.layer_check = check_layer_onnx(single_rank, out / "verify")
        say(f"verify: ONNX layer 0 vs torch (polygraphy, onnxruntime): "
            f"{'passed' if result.layer_check.passed else 'FAILED'}, max |diff| {result.layer_check.max_abs_diff:.2e}")
    if v.throughput_batches:
        result.throughput = measure_throughput(artifact, hf_dir, v.throughput_batches, v.prompt_len, v.new_tokens)
        say("verify: tokens/s " + ", ".join(f"batch {t.batch}: {t.tokens_per_s:.1f}" for t in result.throughput))
    return result


def measure_throughput(engine_dir: Path, tokenizer_dir: Path, batches: tuple[int, ...], prompt_len: int,
                       new_tokens: int) -> list[Throughput]:
    """Output tokens/s of the torch engine on the artifact, greedy (build_engines/throughput.py)."""
    from transformers import AutoTokenizer

    from build_engines.throughput import bench_engine, prompts

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows = []
    for n in batches:
        load = os.getloadavg()[0]
        tok_s = bench_engine(engine_dir, prompts(tok, n, prompt_len), new_tokens)
        rows.append(Throughput(batch=n, tokens_per_s=tok_s, prompt_len=prompt_len, new_tokens=new_tokens,
                               load_average=round(max(load, os.getloadavg()[0]), 2), cpus=os.cpu_count() or 0))
    return rows


def _trtllm_problem(spec: BuildSpec) -> str | None:
    """Why the tensorrt_llm target cannot run here, or None (also None for the torch target)."""
    if spec.target != "tensorrt_llm":
        return None
    from build_engines.trtllm_target import TrtllmUnavailable, check_available

    try:
        check_available()
    except TrtllmUnavailable as exc:
        return str(exc)
    return None
