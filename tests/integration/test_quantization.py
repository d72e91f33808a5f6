"""Quantized builds of the trained demo model, all run by our torch runtime: INT4-AWQ's decoder linears are closer
to float than INT4 round-to-nearest's on held-out text (group 128), INT4-AWQ and FP8 (+ FP8 KV cache) stay within
stated perplexity bounds of float; the FP8 and AWQ builds served by the real tritonserver give the in-process
engine's greedy tokens."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.loader import load_model
from build_engines.quantize.apply import calibrate, quantize_checkpoint
from build_engines.quantize.evaluate import evaluation_tokens, layer_output_errors, score_tokens
from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports
from tests.integration.trtllm_direct import generate_ids

BUILDS = {"int4_rtn": ("int4_rtn", "none"), "int4_awq": ("int4_awq", "none"), "fp8": ("fp8", "fp8")}
CALIB_TOKENS, EVAL_TOKENS, SEQ_LEN = 4096, 8192, 256
# Stated bounds (relative perplexity increase over float, top-1 next-token agreement with float) on held-out text.
# Measured here (8160 tokens): RTN +0.22%, 96.5%; AWQ -0.02%, 96.9%; FP8 + FP8 KV +0.09%, 97.6%.
# Perplexity differences between AWQ and RTN are within the noise of which model the recipe trained (one fresh
# machine measured RTN +0.285%, AWQ +0.302%): AWQ is judged where its effect is large and its objective is, the
# decoder linears' output error, on held-out text. Measured (demo model trained 2026-11-22): AWQ's summed error
# 0.872x RTN's at group 128 (0.81x at 64 and 32), no single linear worse than 1.004x. Bounds: 0.95x in all, 1.05x
# for any linear.
FP8_MAX_PPL_INCREASE, FP8_MIN_TOP1 = 0.01, 0.95
AWQ_MAX_PPL_INCREASE, AWQ_MIN_TOP1 = 0.02, 0.93
AWQ_MAX_ERROR_RATIO, AWQ_MAX_LINEAR_ERROR_RATIO = 0.95, 1.05
PROMPTS = [("def ", 24), ("import os\n", 32)]


@pytest.fixture(scope="module")
def builds(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    stats = calibrate(demo.engine_dir, demo.tokenizer_dir, max_tokens=CALIB_TOKENS, progress=False)
    return {name: quantize_checkpoint(demo.engine_dir, root / name, method, kv, 128, stats=stats, progress=False)
            for name, (method, kv) in BUILDS.items()}


@pytest.fixture(scope="module")
def quality(demo, builds):
    torch.set_num_threads(2)
    tokens = evaluation_tokens(demo.tokenizer_dir, max_tokens=EVAL_TOKENS)
    reference = load_model(demo.engine_dir, torch.device("cpu"))
    models = {name: load_model(d, torch.device("cpu")) for name, d in builds.items()}
    reports = score_tokens(models, tokens, SEQ_LEN, reference)
    for name, r in reports.items():
        print(f"{name}: ppl {r.perplexity:.3f} (float {r.reference_perplexity:.3f}, "
              f"{100 * r.perplexity_increase:+.2f}%), top-1 agreement {100 * r.top1_agreement:.1f}% over {r.tokens} tokens")
    return reports


def test_awq_linears_are_closer_to_float_than_round_to_nearest(demo, builds):
    """On held-out text (not the calibration text), each decoder linear fed the float model's own inputs."""
    torch.set_num_threads(2)
    reference = load_model(demo.engine_dir, torch.device("cpu"))
    models = {name: load_model(builds[name], torch.device("cpu")) for name in ("int4_rtn", "int4_awq")}
    errors = layer_output_errors(reference, models, evaluation_tokens(demo.tokenizer_dir, max_tokens=4096))
    rtn, awq = errors["int4_rtn"], errors["int4_awq"]
    worst = max(awq.per_linear[k] / rtn.per_linear[k] for k in rtn.per_linear)
    print(f"relative output error: RTN {rtn.relative_error:.3e}, AWQ {awq.relative_error:.3e} "
          f"({awq.relative_error / rtn.relative_error:.3f}x); worst linear {worst:.3f}x")
    assert rtn.relative_error > 0  # INT4 does change the linears: the comparison means something
    assert awq.relative_error < AWQ_MAX_ERROR_RATIO * rtn.relative_error
    assert worst < AWQ_MAX_LINEAR_ERROR_RATIO


def test_awq_within_bounds(quality):
    awq = quality["int4_awq"]
    assert awq.perplexity_increase < AWQ_MAX_PPL_INCREASE and awq.top1_agreement > AWQ_MIN_TOP1


def test_fp8_with_fp8_kv_cache_within_bounds(quality):
    fp8 = quality["fp8"]
    assert abs(fp8.perplexity_increase) < FP8_MAX_PPL_INCREASE and fp8.top1_agreement > FP8_MIN_TOP1


def _engine_greedy(ckpt, prompt_ids: list[list[int]], max_tokens: list[int], end_id: int) -> list[list[int]]:
    """The in-process engine's greedy tokens (end_id ends a sequence and is not part of it, as on the server)."""
    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=4, max_input_len=256, max_seq_len=512))
    for i, (ids, n) in enumerate(zip(prompt_ids, max_tokens)):
        engine.add_request(Request(f"r{i}", tuple(ids), SamplingParams(max_tokens=n, end_id=end_id)))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompt_ids))}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
    return [got[f"r{i}"] for i in range(len(prompt_ids))]


@pytest.mark.parametrize("name", ["fp8", "int4_awq"])
def test_quantized_build_serves_the_engines_tokens(name, builds, demo, hf, tmp_path):
    tok = hf[1]
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p, _ in PROMPTS]
    want = _engine_greedy(builds[name], prompt_ids, [n for _, n in PROMPTS], tok.eos_token_id)
    spec = RepoSpec(engine_dir=builds[name], tokenizer_dir=demo.tokenizer_dir, max_batch_size=4, max_input_len=256,
                    max_seq_len=512, max_num_tokens=256)
    http, grpc, metrics = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, tmp_path / "repo"), http, grpc, metrics),
                       log_path=tmp_path / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm", "preprocessing", "postprocessing"))
    try:
        for ids, (_, n), expected in zip(prompt_ids, PROMPTS, want):
            chunks = generate_ids(srv.grpc_url, ids, n, False, end_id=tok.eos_token_id)
            assert [t for c in chunks for t in c] == expected
    finally:
        srv.stop()
