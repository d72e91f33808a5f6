"""A bfloat16 / float16 checkpoint run as a float32 model (EngineConfig.linear_dtype "float32", and "auto" on a CPU
without native bf16 arithmetic, where float32 is the fast dtype): its weights widened exactly, so the engine is the
float32 engine of the same values, token for token and logit for logit; refused with a reason where the linears
are not plain float ones; kept in the checkpoint's dtype where widening would cost the KV cache capacity."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.engine import llm_engine
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.memory_plan import free_memory_bytes
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.config import kv_bytes_per_token, load_model_config
from backend.model.loader import float32_growth, load_model
from backend.model.prepacked_linear import PrepackedLinear, resolve_linear_dtype
from backend.model.scoring import window_logits
from build_engines.convert import convert_hf_to_trtllm
from tests.conftest import random_prompts
from tests.unit.model.bf16_values import float32_gemv_copies

CPU = torch.device("cpu")
LIMITS = dict(max_batch_size=4, max_num_tokens=64, max_input_len=48, max_seq_len=80, tokens_per_block=8, device="cpu")


@pytest.fixture(scope="module")
def checkpoints(family_checkpoint, tmp_path_factory):
    """name -> (the family's checkpoint in bfloat16, the same values widened and saved as a float32 checkpoint)."""
    root, made = tmp_path_factory.mktemp("widening"), {}

    def get(name: str):
        if name not in made:
            bf16 = convert_hf_to_trtllm(family_checkpoint(name)[0], root / f"{name}.bf16", dtype="bfloat16")
            wide = root / f"{name}.widened"
            shutil.copytree(bf16, wide)
            tensors = load_file(str(bf16 / "rank0.safetensors"))
            save_file({k: v.float() for k, v in tensors.items()}, str(wide / "rank0.safetensors"))
            config = json.loads((bf16 / "config.json").read_text())
            (wide / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
            made[name] = bf16, wide
        return made[name]

    return get


@pytest.fixture
def software_bf16(monkeypatch):
    """A CPU without native bf16 arithmetic, whatever this one has (only the choice reads it: everything runs in
    float32 then)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)


def test_where_float32_is_chosen(monkeypatch):
    quantized = "the checkpoint is quantized (int4_awq, KV cache None)"
    assert resolve_linear_dtype("float32", CPU, torch.bfloat16) is torch.float32
    assert resolve_linear_dtype("float32", CPU, torch.float16) is torch.float32
    assert resolve_linear_dtype("float32", CPU, torch.float32) is None  # already float32
    assert resolve_linear_dtype("float32", "cuda", torch.bfloat16) is torch.float32  # asked for: any device
    with pytest.raises(ValueError, match="linear_dtype 'float32' is unavailable: the checkpoint is quantized"):
        resolve_linear_dtype("float32", CPU, torch.bfloat16, quantized)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16) is torch.float32
    assert resolve_linear_dtype("auto", CPU, torch.float16) is torch.float32
    assert resolve_linear_dtype("auto", CPU, torch.float32) is None
    assert resolve_linear_dtype("auto", CPU, torch.bfloat16, quantized) is None
    assert resolve_linear_dtype("auto", "cuda", torch.bfloat16) is None  # CUDA has its own bf16 arithmetic
    assert resolve_linear_dtype("checkpoint", CPU, torch.bfloat16) is None
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert resolve_linear_dtype("auto", CPU, torch.float16) is None  # native bf16: float16 keeps its own dtype


@pytest.mark.parametrize("name", ["llama3", "qwen2", "gemma2"])  # plain, qkv bias, soft caps + sandwich norms
def test_the_widened_model_is_the_float32_model_of_the_same_values(checkpoints, name):
    bf16, wide = checkpoints(name)
    ids = torch.tensor(random_prompts([40], 8192, seed=len(name)))
    widened = load_model(bf16, CPU, linear_dtype=torch.float32)
    assert {p.dtype for p in widened.parameters()} == {torch.float32}
    assert torch.equal(window_logits(widened, ids), window_logits(load_model(wide, CPU), ids))


@pytest.mark.parametrize("choice", ["float32", "auto"])
def test_the_engine_generates_the_float32_engines_tokens(checkpoints, choice, software_bf16):
    """Both prompts decode together (products of two rows), then the longer alone (one row); the GEMV and the
    compiled decode layers run as for any float32 checkpoint, the GEMV reading bf16 copies of the weights (exact):
    the float32 checkpoint of the same values on float32 copies gives the same tokens."""
    bf16, wide = checkpoints("llama3")
    assert load_model_config(bf16).dtype == "bfloat16"
    engines = [LLMEngine(bf16, EngineConfig(**LIMITS, linear_dtype=choice)), LLMEngine(wide, EngineConfig(**LIMITS))]
    ours = engines[0]
    assert ours.model_config.dtype == "float32" and ours.runner.native_layers is not None
    assert {p.dtype for pools in ours.runner.kv.layers for p in pools} == {torch.float32}
    assert {m.dtype for m in ours.runner.model.modules() if isinstance(m, PrepackedLinear)} == {torch.float32}
    assert ours.runner.decode_gemv == engines[1].runner.decode_gemv
    if ours.runner.decode_gemv:
        copies = {m.gemv.dtype for m in ours.runner.model.modules() if isinstance(m, PrepackedLinear)}
        assert copies == {torch.bfloat16}
        float32_gemv_copies(engines[1].runner.model, engines[1].runner.native_layers)
    prompts, lengths = random_prompts([40, 12], 8192, seed=7), (16, 6)
    got = [engine.generate([Request(f"r{i}", p, SamplingParams(max_tokens=n))
                            for i, (p, n) in enumerate(zip(prompts, lengths))]) for engine in engines]
    assert got[0] == got[1] and [len(got[0][f"r{i}"]) for i in range(2)] == list(lengths)


def test_explicit_float32_beside_torch_linears(checkpoints):
    """Widening needs no oneDNN: with torch's linears the model is float32 all the same."""
    engine = LLMEngine(checkpoints("llama3")[0], EngineConfig(**LIMITS, linear_dtype="float32", linear_kernel="torch"))
    assert engine.model_config.dtype == "float32" and engine.runner.linear_kernel == "torch"
    assert {p.dtype for p in engine.runner.model.parameters()} == {torch.float32}


def test_auto_keeps_the_checkpoints_dtype_where_widening_costs_cache_capacity(checkpoints, software_bf16,
                                                                               monkeypatch):
    """Float32 K/V rows take twice the bytes: with memory the limit (a small kv_cache_free_mem_fraction), "auto"
    widens only where the cache keeps its tokens, the widened weights' growth counted (made decisive here by a
    growth of half the memory)."""
    bf16 = checkpoints("llama3")[0]
    limits = dict(LIMITS, max_batch_size=8, max_seq_len=64, max_input_len=32)
    sequences = 64 * kv_bytes_per_token(load_model_config(bf16)) / free_memory_bytes(CPU)  # one bf16 sequence's
    assert float32_growth(bf16) == sum(t.numel() * 2 for t in load_file(str(bf16 / "rank0.safetensors")).values())
    roomy = LLMEngine(bf16, EngineConfig(**limits))  # max_batch_size x max_seq_len is the limit
    assert roomy.model_config.dtype == "float32" and roomy.kv_plan.tokens == 8 * 64
    tight = LLMEngine(bf16, EngineConfig(**limits, kv_cache_free_mem_fraction=4.5 * sequences))
    assert tight.model_config.dtype == "bfloat16" and 4 * 64 <= tight.kv_plan.tokens <= 5 * 64
    ample = EngineConfig(**limits, kv_cache_free_mem_fraction=20 * sequences)  # 10 float32 sequences: room for 8
    assert LLMEngine(bf16, ample).model_config.dtype == "float32"
    monkeypatch.setattr(llm_engine, "float32_growth", lambda ckpt_dir: free_memory_bytes(CPU) // 2)
    assert LLMEngine(bf16, ample).model_config.dtype == "bfloat16"  # 5 float32 sequences after the growth
