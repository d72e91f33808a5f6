"""oneDNN prepacked linears (backend/model/prepacked_linear.py) and the KV gather: same products as F.linear, the
engine's greedy tokens equal HF's with either kernel, and every unusable choice refused with its reason."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.engine.config import EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.decoder import gather
from backend.model.prepacked_linear import (
    PrepackedLinear,
    ideep_cache_unusable,
    onednn_unavailable,
    prepack_linears,
    resolve_linear_kernel,
)
from backend.model.quantized_kv import Fp8KVPool
from tests.unit.import_rules import ROOT
from tests.unit.model.fused_mlp import FusedMlp

needs_onednn = pytest.mark.skipif(onednn_unavailable("cpu") is not None, reason="torch without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 16, 300])  # decode batches and a prefill chunk, one packing for all
@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_linear_matches_f_linear(rows, bias):
    torch.manual_seed(rows)
    lin = nn.Linear(96, 160, bias=bias)
    x = torch.randn(rows, 96)
    packed = PrepackedLinear.of(lin)
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)
    assert packed.weight_bytes == 96 * 160 * 4


@needs_onednn
def test_prepack_swaps_plain_linears_and_the_fused_mlp_weight():
    model = nn.Sequential(FusedMlp(), nn.Embedding(4, 8))
    state_keys = set(model.state_dict())
    x, h = torch.randn(3, 8), torch.randn(3, 16)
    fused_before, proj_before = F.linear(x, model[0].fc_gate), model[0].proj(h)
    prepack_linears(model)
    mlp = model[0]
    assert isinstance(mlp.fc_gate, PrepackedLinear) and isinstance(mlp.proj, PrepackedLinear)
    assert type(mlp.fc) is nn.Linear and type(mlp.gate) is nn.Linear  # unused once fused: not packed twice
    torch.testing.assert_close(mlp.fc_gate(x), fused_before)
    torch.testing.assert_close(mlp.proj(h), proj_before)
    assert set(model.state_dict()) <= state_keys  # packed weights are not checkpoint tensors


@pytest.mark.parametrize("kernel", ["torch", pytest.param("onednn", marks=needs_onednn)])
def test_engine_greedy_matches_hf_with_each_kernel(kernel, make_engine, prompts, hf_greedy):
    engine = make_engine(linear_kernel=kernel)
    assert engine.runner.linear_kernel == kernel
    reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=6)) for i, p in
            enumerate(prompts([3, 17, 40], engine.vocab_size, seed=5))]
    assert engine.generate(reqs) == {r.request_id: hf_greedy(r.prompt_ids, 6) for r in reqs}


def test_auto_picks_onednn_for_float32_cpu_only():
    expected = "torch" if onednn_unavailable("cpu") else "onednn"
    assert resolve_linear_kernel("auto", "cpu", torch.float32) == expected
    assert resolve_linear_kernel("auto", "cpu", torch.float16) == "torch"
    assert resolve_linear_kernel("torch", "cpu", torch.float32) == "torch"


@pytest.mark.parametrize("kwargs, message", [
    ({"linear_kernel": "mkl"}, "linear_kernel must be one of"),
    ({"linear_kernel": "onednn", "device": "cuda"}, "runs on CPU only"),
    ({"num_threads": 0}, "num_threads must be > 0"),
])
def test_config_refuses_unusable_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_runner_refuses_onednn_for_a_dtype_it_does_not_serve():
    with pytest.raises(ValueError, match="'onednn' is unavailable.*float16"):
        resolve_linear_kernel("onednn", "cpu", torch.float16)


def test_gather_equals_advanced_indexing_for_float_and_fp8_pools():
    cache = torch.randn(64, 2, 4)
    slots = torch.tensor([[3, 4, 5, 0], [40, 41, 0, 0]])
    torch.testing.assert_close(gather(cache, slots), cache[slots], rtol=0, atol=0)
    pool = Fp8KVPool((64, 2, 4), torch.tensor([0.5]), torch.float32, torch.device("cpu"))
    pool.index_copy_(0, torch.arange(64), cache)
    torch.testing.assert_close(gather(pool, slots), pool[slots], rtol=0, atol=0)


@pytest.mark.parametrize("value, crashes", [("0", True), ("abc", True), ("", True), (" 0", True), ("1024", False),
                                            ("-1", False), (" 7x", False)])
def test_an_lru_cache_capacity_that_reads_as_zero_is_refused(value, crashes, monkeypatch, caplog):
    """ideep reads LRU_CACHE_CAPACITY with atoi; 0 primitives makes the first oneDNN linear segfault."""
    monkeypatch.setenv("LRU_CACHE_CAPACITY", value)
    assert (ideep_cache_unusable() is not None) is crashes
    if not crashes or onednn_unavailable("cpu", None) != ideep_cache_unusable():
        return
    assert resolve_linear_kernel("auto", "cpu", torch.float32) == "torch"
    assert f"LRU_CACHE_CAPACITY={value!r}" in caplog.text
    with pytest.raises(ValueError, match="'onednn' is unavailable: LRU_CACHE_CAPACITY"):
        resolve_linear_kernel("onednn", "cpu", torch.float32)


LINEAR = ("import backend, torch\n"
          "from backend.model.prepacked_linear import PrepackedLinear, resolve_linear_kernel\n"
          "lin, x = torch.nn.Linear(8, 8), torch.randn(3, 8)\n")


def run_with_lru_zero(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINEAR + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LRU_CACHE_CAPACITY": "0"})


@needs_onednn
def test_the_refusal_is_still_needed_and_auto_serves_without_crashing():
    """The premise, against the torch installed: a oneDNN linear under LRU_CACHE_CAPACITY=0 dies of SIGSEGV (if a
    torch fixes it, this fails: drop the refusal); "auto" picks torch's linears there and runs."""
    assert run_with_lru_zero("PrepackedLinear.of(lin)(x)").returncode == -11
    done = run_with_lru_zero("k = resolve_linear_kernel('auto', 'cpu', torch.float32); print(k, tuple(lin(x).shape))")
    assert done.returncode == 0 and done.stdout.split() == ["torch", "(3,", "8)"]
