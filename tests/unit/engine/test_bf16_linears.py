"""bf16 linears beside float32 activations (EngineConfig.linear_dtype, backend/model/prepacked_linear.py) for a
bfloat16 checkpoint: chosen by "auto" where the CPU has native bf16, refused with a reason where it cannot run, and
as close to the checkpoint's float32 reference as HF transformers' own bfloat16 run (the oracle for bf16
is closeness of log-probs: bit-level agreement is not defined across bf16 kernels).

The reference: HF's model of the same checkpoint loaded in bfloat16 (its exact weights), then run in float32."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.engine import llm_engine
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.memory_plan import free_memory_bytes
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.config import kv_bytes_per_token, load_model_config
from backend.model.kernels.bf16_gemv import unsupported as gemv_unsupported
from backend.model.kernels.causal_prefill import unsupported as causal_prefill_unsupported
from backend.model.loader import load_model
from backend.model.prepacked_linear import (
    PrepackedLinear, bf16_linears_unavailable, prepack_linears, resolve_linear_dtype)
from backend.model.scoring import window_logits
from build_engines.convert import convert_hf_to_trtllm
from tests.conftest import random_prompts

CPU = torch.device("cpu")
UNAVAILABLE = bf16_linears_unavailable(CPU)
needs_bf16 = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"bf16 linears: {UNAVAILABLE}")
NO_GEMV = gemv_unsupported(CPU)
needs_gemv = pytest.mark.skipif(NO_GEMV is not None, reason=f"bf16 GEMV: {NO_GEMV}")
NO_KERNEL = causal_prefill_unsupported(16, torch.bfloat16, CPU)  # the fixtures: head size 16
needs_causal_kernel = pytest.mark.skipif(NO_KERNEL is not None, reason=f"causal prefill kernel: {NO_KERNEL}")
FAMILIES = ["llama3", "qwen2", "gemma2", "phi3_partial"]  # plain, qkv bias, soft caps + sandwich norms, partial rope


@pytest.fixture(scope="module")
def bf16_checkpoint(family_checkpoint, tmp_path_factory):
    root, made = tmp_path_factory.mktemp("bf16"), {}

    def get(name: str):
        if name not in made:
            hf_dir = family_checkpoint(name)[0]
            made[name] = hf_dir, convert_hf_to_trtllm(hf_dir, root / name, dtype="bfloat16")
        return made[name]

    return get


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def _hf(hf_dir, dtype: torch.dtype) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="eager")
    return model.to(dtype).eval()


@needs_bf16
@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_causal_kernel)],
                         ids=["sdpa", "causal_kernel"])
@pytest.mark.parametrize("name", FAMILIES)
def test_log_probs_as_close_to_float32_as_hf_bfloat16(bf16_checkpoint, name, kernel):
    """Prefill attention by SDPA, and by the compiled causal kernel where the CPU has it (bf16 queries and
    probabilities in its products; Gemma 2's soft-capped scores keep the eager path either way)."""
    hf_dir, ckpt = bf16_checkpoint(name)
    ids = torch.tensor(random_prompts([3 * 16], 8192, seed=len(name)))
    with torch.inference_mode():
        reference = _log_probs(_hf(hf_dir, torch.float32)(ids).logits)
        hf_bf16 = _log_probs(_hf(hf_dir, torch.bfloat16)(ids).logits)
    model = load_model(ckpt, CPU, linear_dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.float32, torch.bfloat16}  # linears never widened
    model = prepack_linears(model, torch.bfloat16)
    ours = _log_probs(window_logits(model, ids, kv_dtype=torch.bfloat16, causal_prefill=kernel))  # K/V rows bf16
    hf_err, our_err = (hf_bf16 - reference).abs(), (ours - reference).abs()
    print(f"{name}: |log p - float32| mean / max: HF bf16 {hf_err.mean():.2e} / {hf_err.max():.2e}, "
          f"ours {our_err.mean():.2e} / {our_err.max():.2e}")
    assert our_err.max() > 0  # the linears did round (a float32 run would equal the reference to ~1e-6)
    # Measured on the four fixtures: mean 0.67-0.97x HF's (the residual stream, norms and attention arithmetic stay
    # float32; K/V rows are bf16 as in HF), max 0.60-0.84x (0.57-1.16x with float32 K/V rows; 0.64-1.26x with the
    # causal kernel's bf16 queries and probabilities, mean 0.70-0.97x). Bounds: no worse on
    # average than HF within a quarter; the largest single error (one element of 48 x 8192) of the same order as
    # HF's. A wrong rounding or dtype path is orders of magnitude off.
    assert our_err.mean() <= 1.25 * hf_err.mean() and our_err.max() <= 2 * hf_err.max()


@needs_bf16
@pytest.mark.parametrize("gemv", ["off", pytest.param("on", marks=needs_gemv)])
@pytest.mark.parametrize("name", FAMILIES)
def test_engine_greedy_picks_float32_near_ties_only(bf16_checkpoint, name, gemv):
    """The engine (bf16 linears here, compiled decode layers; the one-row GEMV on or off) generates greedily, the
    second request stopping early so that the first decodes alone (one-row products) for its last 10 steps; under
    the float32 reference, every token it picked is the best one or within HF bfloat16's own error of it."""
    hf_dir, ckpt = bf16_checkpoint(name)
    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=4, max_num_tokens=64, max_input_len=48, max_seq_len=80,
                                          tokens_per_block=8, device="cpu", decode_gemv=gemv))
    assert engine.runner.linear_kernel == "onednn" and engine.runner.native_layers is not None
    assert engine.runner.causal_prefill == (NO_KERNEL is None)  # both prompts prefill in one step: two ranges
    assert {m.dtype for m in engine.runner.model.modules() if isinstance(m, PrepackedLinear)} == {torch.bfloat16}
    assert engine.runner.decode_gemv == (gemv == "on")
    prompts, lengths = random_prompts([40, 12], 8192, seed=len(name) + 1), (16, 6)
    got = engine.generate([Request(f"r{i}", p, SamplingParams(max_tokens=n))
                           for i, (p, n) in enumerate(zip(prompts, lengths))])
    reference, hf_bf16 = _hf(hf_dir, torch.float32), _hf(hf_dir, torch.bfloat16)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([list(prompt) + got[f"r{i}"]])
        with torch.inference_mode():
            ref = _log_probs(reference(ids).logits)[0, len(prompt) - 1:-1]  # (n, vocab): what predicts each token
            noise = (_log_probs(hf_bf16(ids).logits)[0, len(prompt) - 1:-1] - ref).abs().max()
        gaps = ref.max(-1).values - ref.gather(-1, torch.tensor(got[f"r{i}"])[:, None])[:, 0]
        print(f"{name} r{i}: float32 gap of the picked tokens max {gaps.max():.2e} (HF bf16 error {noise:.2e})")
        assert (gaps <= 2 * noise).all(), gaps


def test_where_bf16_linears_are_chosen(monkeypatch):
    """What resolve_linear_dtype decides on a CPU with and without native bf16 (the check is patched: it only
    decides here, nothing runs)."""
    with pytest.raises(ValueError, match="linear_dtype must be one of"):
        EngineConfig(linear_dtype="float16")
    with pytest.raises(ValueError, match="linear_dtype 'bfloat16' runs on oneDNN on CPU, not linear_kernel 'torch'"):
        EngineConfig(linear_dtype="bfloat16", linear_kernel="torch")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16) is torch.bfloat16
    assert resolve_linear_dtype("auto", CPU, torch.float32) is None  # a float32 checkpoint stays exact
    assert resolve_linear_dtype("bfloat16", CPU, torch.float32) is torch.bfloat16  # asked for: weights rounded
    assert resolve_linear_dtype("checkpoint", CPU, torch.bfloat16) is None
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16, "the checkpoint is quantized") is None
    with pytest.raises(ValueError, match="linear_dtype 'bfloat16' is unavailable: the checkpoint is quantized"):
        resolve_linear_dtype("bfloat16", CPU, torch.bfloat16, "the checkpoint is quantized")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16) is torch.float32  # widened (test_float32_widening.py)
    with pytest.raises(ValueError, match="unavailable: this CPU has no native bf16 arithmetic"):
        resolve_linear_dtype("bfloat16", CPU, torch.bfloat16)


@needs_bf16
def test_auto_on_a_bfloat16_checkpoint(bf16_checkpoint):
    ckpt = bf16_checkpoint("llama3")[1]
    assert load_model_config(ckpt).dtype == "bfloat16"
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16) is torch.bfloat16
    engine = LLMEngine(ckpt, EngineConfig(max_batch_size=2, max_seq_len=64, max_input_len=32, device="cpu",
                                          linear_dtype="checkpoint"))
    assert engine.model_config.dtype == "bfloat16" and engine.runner.native_layers is None


@needs_bf16
def test_bf16_linears_keep_a_bf16_kv_cache_of_the_same_capacity(bf16_checkpoint, monkeypatch):
    """K/V rows stay bf16 beside bf16 linears, so a memory-bound cache (a small kv_cache_free_mem_fraction) holds
    what it holds with the checkpoint's dtype everywhere. "auto" keeps bf16 everywhere only where widening the
    embedding and norms to float32 would cost the cache capacity (made so here: a widening of half the memory)."""
    ckpt = bf16_checkpoint("llama3")[1]
    limits = dict(max_batch_size=8, max_seq_len=64, max_input_len=32, tokens_per_block=8, device="cpu")
    per_token = kv_bytes_per_token(load_model_config(ckpt))  # bfloat16 rows
    fraction = 4.5 * 64 * per_token / free_memory_bytes(CPU)  # ~4.5 sequences
    kept = LLMEngine(ckpt, EngineConfig(**limits, kv_cache_free_mem_fraction=fraction, linear_dtype="checkpoint"))
    tight = LLMEngine(ckpt, EngineConfig(**limits, kv_cache_free_mem_fraction=fraction))
    assert tight.model_config.dtype == "float32" and tight.runner.native_layers is not None
    assert {p.dtype for pools in tight.runner.kv.layers for p in pools} == {torch.bfloat16}
    assert 4 * 64 <= tight.kv_plan.tokens <= 5 * 64 and 4 * 64 <= kept.kv_plan.tokens <= 5 * 64
    roomy = LLMEngine(ckpt, EngineConfig(**limits))  # max_batch_size x max_seq_len is the limit
    assert roomy.model_config.dtype == "float32" and roomy.kv_plan.tokens == 8 * 64
    monkeypatch.setattr(llm_engine, "widened_bytes", lambda cfg, ckpt_dir: free_memory_bytes(CPU) // 2)
    widening = LLMEngine(ckpt, EngineConfig(**limits, kv_cache_free_mem_fraction=fraction))
    assert widening.model_config.dtype == "bfloat16" and widening.runner.native_layers is None


@needs_bf16
def test_bfloat16_asked_for_on_a_float32_checkpoint(family_checkpoint):
    """Asked for explicitly, a float32 checkpoint's linears are rounded to bf16 (its greedy tokens then need not be
    float32's); "auto" leaves a float32 checkpoint exact."""
    ckpt = family_checkpoint("llama3")[1]
    limits = dict(max_batch_size=2, max_seq_len=64, max_input_len=32, tokens_per_block=8, device="cpu")
    asked = LLMEngine(ckpt, EngineConfig(**limits, linear_dtype="bfloat16"))
    assert {m.dtype for m in asked.runner.model.modules() if isinstance(m, PrepackedLinear)} == {torch.bfloat16}
    [prompt] = random_prompts([20], 8192, seed=3)
    assert len(asked.generate([Request("r", prompt, SamplingParams(max_tokens=8))])["r"]) == 8
    auto = LLMEngine(ckpt, EngineConfig(**limits))
    assert {m.dtype for m in auto.runner.model.modules() if isinstance(m, PrepackedLinear)} == {torch.float32}


@needs_bf16
@needs_gemv
def test_auto_takes_the_gemv_where_the_kv_cache_keeps_its_capacity(bf16_checkpoint, monkeypatch):
    """The GEMV's weight copies are planned for: "auto" takes them only where the KV cache keeps the tokens it would
    hold without them (made so here: copies of half the memory)."""
    ckpt = bf16_checkpoint("llama3")[1]
    limits = dict(max_batch_size=8, max_seq_len=64, max_input_len=32, tokens_per_block=8, device="cpu")
    fraction = 4.5 * 64 * kv_bytes_per_token(load_model_config(ckpt)) / free_memory_bytes(CPU)  # ~4.5 sequences
    monkeypatch.setattr(llm_engine, "gemv_copy_bytes", lambda model, dtype: free_memory_bytes(CPU) // 2)
    roomy = LLMEngine(ckpt, EngineConfig(**limits))  # max_batch_size x max_seq_len is the limit
    assert roomy.runner.decode_gemv and roomy.kv_plan.tokens == 8 * 64
    tight = LLMEngine(ckpt, EngineConfig(**limits, kv_cache_free_mem_fraction=fraction))
    assert not tight.runner.decode_gemv and 4 * 64 <= tight.kv_plan.tokens <= 5 * 64
    asked = LLMEngine(ckpt, EngineConfig(**limits, kv_cache_free_mem_fraction=fraction, decode_gemv="on"))
    assert asked.runner.decode_gemv and asked.kv_plan.tokens <= 3 * 64  # the copies' memory left the cache
