"""The compiled decode layers (backend/model/kernels/decode_layers.cpp) against the Python layers they stand in for:
the same output and the same KV pools bit for bit on a decode step of every family fixture (biases, q/k norms,
sandwich norms with soft caps and float32 norm weights, fused gate/up, partial rotary, sliding windows; ragged
contexts starting past released blocks), with float32 linears and with bf16 ones; and where they are and are not
chosen."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.model.kernels.gemv import unsupported as gemv_unsupported
from backend.model.decoder import RMSNorm
from backend.model.kernels.decode_layers import resolve_decode_layers, unsupported
from backend.model.loader import load_model
from backend.model.prepacked_linear import bf16_linears_unavailable
from backend.model.runner import ModelRunner, model_step_tensors
from backend.model.step_inputs import StepInputs
from tests.unit.model.bf16_values import float32_gemv_copies, round_to_bf16_values

CPU = torch.device("cpu")
FAMILIES = ["llama2", "llama3", "mistral", "qwen2", "qwen2_swa", "qwen3", "gemma2", "phi3_4k", "phi3_partial"]
BLOCK, BLOCKS = 8, 64


def _decode_step(lengths: list[int], ctx_start: list[int], seed: int) -> StepInputs:
    """One new token per sequence at position length - 1; contexts in shuffled blocks of the pool."""
    g = torch.Generator().manual_seed(seed)
    L = max(n - s for n, s in zip(lengths, ctx_start))
    blocks, per_seq = torch.randperm(BLOCKS, generator=g), -(-L // BLOCK)
    rows = [(blocks[b * per_seq:(b + 1) * per_seq, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:L]
            for b in range(len(lengths))]
    end = torch.tensor(lengths)
    return StepInputs.of(tokens=torch.randint(1, 1000, (len(lengths),), generator=g), start=end - 1, end=end,
                         sampled=torch.ones(len(lengths), dtype=torch.long), context_slots=torch.stack(rows),
                         ctx_start=torch.tensor(ctx_start))


def _runner(family_checkpoint, name: str, decode_layers: str = "native", bf16_values: bool = False,
            **kernels) -> ModelRunner:
    """bf16_values: every weight rounded to bf16 first (a bf16 checkpoint run as a float32 model)."""
    model = load_model(family_checkpoint(name)[1], CPU)
    if bf16_values:
        round_to_bf16_values(model)
    kernels = {"linear_kernel": "onednn", "attention_kernel": "paged", **kernels}
    return ModelRunner(model, BLOCKS, BLOCK, CPU, decode_layers=decode_layers, **kernels)


LINEAR_DTYPES = [None, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    bf16_linears_unavailable(CPU) is not None, reason=f"bf16 linears: {bf16_linears_unavailable(CPU)}"))]


@pytest.mark.parametrize("linear_dtype", LINEAR_DTYPES, ids=["float32", "bf16-linears"])
@pytest.mark.parametrize("name", FAMILIES)
def test_equal_to_the_python_layers_bit_for_bit(family_checkpoint, name, linear_dtype):
    """Float32 linears, and bf16 ones beside float32 activations (each side rounds x and widens y the same way)."""
    runner = _runner(family_checkpoint, name, linear_dtype=linear_dtype)
    assert runner.native_layers is not None
    _assert_layers_equal(runner, _decode_step([37, 1, 60, 24], ctx_start=[0, 0, 16, 8], seed=len(name)))


def _assert_layers_equal(runner: ModelRunner, inputs: StepInputs, own_dtype: bool = False) -> None:
    """The Python and the compiled layers on one decode step, each on its own copy of the same random KV pools
    (float32, or the runner's pools' dtype): the same output and the same pools, bit for bit."""
    input_ids, meta, _ = model_step_tensors(runner.model, inputs, CPU, paged_decode=True)
    g = torch.Generator().manual_seed(7)
    pools = [tuple(torch.randn(p.shape, generator=g).to(p.dtype if own_dtype else torch.float32) for p in pair)
             for pair in runner.kv.layers]
    mine = [(k.clone(), v.clone()) for k, v in pools]
    with torch.inference_mode():
        x = runner.model.embed(input_ids)
        want = runner.model.run_layers(x, meta, pools)
        got = runner.native_layers(x, meta, mine)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for pair, other in zip(pools, mine) for a, b in zip(pair, other))


def _prefill_step(lengths: list[int], seed: int) -> StepInputs:
    """Prompts from position 0, in consecutive blocks of the pool."""
    g = torch.Generator().manual_seed(seed)
    L, per_seq = max(lengths), -(-max(lengths) // BLOCK)
    rows = [torch.arange(b * per_seq * BLOCK, b * per_seq * BLOCK + L) for b in range(len(lengths))]
    end = torch.tensor(lengths)
    return StepInputs.of(tokens=torch.randint(1, 1000, (sum(lengths),), generator=g), start=torch.zeros_like(end),
                         end=end, sampled=torch.ones(len(lengths), dtype=torch.long), context_slots=torch.stack(rows))


@pytest.mark.parametrize("linear_dtype", LINEAR_DTYPES, ids=["float32", "bf16-linears"])
@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma2", "phi3_4k", "phi3_partial", "qwen2_swa"])
def test_the_one_pass_forms_change_no_bit_of_a_prefill_or_its_logits(family_checkpoint, name, linear_dtype):
    """Where the compiled layers run, the model's float32 norms outside them (the prefill's, the final one), its
    rotary and K/V writes and its SiLU MLPs beside bf16 linears take the one-pass forms where they give ATen's bits
    (one_pass_norms, one_pass_rotary, one_pass_mlps): a prefill step's logits and K/V pools equal those of the Python
    layers' runner, whose are ATen's, bit for bit (partial rotary, sliding windows, q / k norms left to ATen)."""
    native = _runner(family_checkpoint, name, linear_dtype=linear_dtype)
    python = _runner(family_checkpoint, name, "python", linear_dtype=linear_dtype)
    kernels = native.native_layers.kernels
    norms = [m for m in native.model.modules() if isinstance(m, RMSNorm)]
    assert all((m.one_pass is not None) == kernels.norm_rows_exact() for m in norms)
    assert all(m.one_pass is None for m in python.model.modules() if isinstance(m, RMSNorm))
    mlp = native.model.features.mlp
    silu_bf16 = (linear_dtype == torch.bfloat16 and mlp.activation == "silu" and not mlp.fused
                 and kernels.silu_rows_exact())  # llama3, qwen3, qwen2_swa (gemma2: gelu; phi3: [up | gate])
    assert all((layer.mlp.act_mul_rows is not None) == silu_bf16 for layer in native.model.transformer.layers)
    assert all(layer.mlp.act_mul_rows is None for layer in python.model.transformer.layers)
    assert all((layer.attention.rotate_store is not None) == (layer.attention.q_layernorm is None)
               for layer in native.model.transformer.layers)
    assert all(layer.attention.rotate_store is None for layer in python.model.transformer.layers)
    inputs = _prefill_step([37, 20, 64], seed=len(name))
    assert torch.equal(native.run(inputs), python.run(inputs))
    assert all(torch.equal(a, b) for pair, other in zip(native.kv.layers, python.kv.layers) for a, b in zip(pair, other))


def test_where_the_compiled_layers_are_chosen(family_checkpoint, caplog):
    assert _runner(family_checkpoint, "llama2", "auto").native_layers is not None
    assert _runner(family_checkpoint, "llama2", "python").native_layers is None
    with caplog.at_level("WARNING"):
        assert _runner(family_checkpoint, "llama2", "auto", linear_kernel="torch").native_layers is None
        assert _runner(family_checkpoint, "llama2", "auto", attention_kernel="torch").native_layers is None
    assert "decode_layers" not in caplog.text  # choosing the Python layers under "auto" is no warning
    with pytest.raises(ValueError, match="decode_layers 'native' is unavailable: layer 0: its qkv linear is a "
                                         "Linear, not a oneDNN-prepacked float linear"):
        _runner(family_checkpoint, "llama2", linear_kernel="torch")
    with pytest.raises(ValueError, match="decode_layers 'native' is unavailable: decode attention is not the paged"):
        _runner(family_checkpoint, "llama2", attention_kernel="torch")
    runner = _runner(family_checkpoint, "llama2", "python")
    with pytest.raises(ValueError, match="decode_layers must be one of"):
        resolve_decode_layers("compiled", runner.model, runner.kv.layers, "paged")
    fp8_like = [(object(), object())] * len(runner.kv.layers)
    assert "not a float32 or bfloat16 pool" in unsupported(runner.model, fp8_like)


def test_the_config_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="decode_layers must be one of"):
        EngineConfig(decode_layers="fast")
    with pytest.raises(ValueError, match="decode_layers 'native' needs the paged attention kernel and oneDNN linears"):
        EngineConfig(decode_layers="native", attention_kernel="torch")
    with pytest.raises(ValueError, match="decode_layers 'native' needs the paged attention kernel and oneDNN linears"):
        EngineConfig(decode_layers="native", linear_kernel="torch")
    with pytest.raises(ValueError, match="decode_layers 'native' runs on CPU only"):
        EngineConfig(decode_layers="native", device="cuda")


GEMV_DTYPES = [
    pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
        gemv_unsupported(CPU, torch.bfloat16) is not None or bf16_linears_unavailable(CPU) is not None,
        reason=f"bf16 GEMV: {gemv_unsupported(CPU, torch.bfloat16) or bf16_linears_unavailable(CPU)}")),
    pytest.param(None, marks=pytest.mark.skipif(gemv_unsupported(CPU, torch.float32) is not None,
                                                reason=f"float32 GEMV: {gemv_unsupported(CPU, torch.float32)}"))]


@pytest.mark.parametrize("linear_dtype", GEMV_DTYPES, ids=["bf16-linears", "float32"])
@pytest.mark.parametrize("name", ["llama3", "qwen2", "gemma2", "phi3_partial"])
@pytest.mark.parametrize("lengths, ctx_start", [([37], [8]), ([37, 1, 60, 24, 9, 33, 5], [0, 0, 16, 8, 0, 0, 0])])
def test_decode_steps_on_the_gemv_bit_for_bit(family_checkpoint, name, lengths, ctx_start, linear_dtype):
    """A decode step of 1 or 7 sequences with the linears on the GEMV (backend/model/kernels/gemv.py, up to 16 rows):
    bf16 linears beside float32 activations, or float32 ones; the compiled layers call the same kernel on the same
    copies as the Python layers."""
    runner = _runner(family_checkpoint, name, linear_dtype=linear_dtype, decode_gemv="on")
    assert runner.decode_gemv and runner.native_layers is not None
    assert all(t.numel() > 0 for t in runner.native_layers.weights[11::15])  # the qkv GEMV copy of every layer
    step = _decode_step(lengths, ctx_start=ctx_start, seed=len(name))
    _assert_layers_equal(runner, step, own_dtype=True)  # the runner's pools: bf16 beside bf16 linears


@pytest.mark.skipif(gemv_unsupported(CPU, torch.float32) is not None,
                    reason=f"float32 GEMV: {gemv_unsupported(CPU, torch.float32)}")
@pytest.mark.parametrize("name", ["llama3", "qwen2", "gemma2"])
def test_bf16_held_copies_give_the_float32_copies_bits(family_checkpoint, name):
    """A float32 model of bf16 values (a bf16 checkpoint widened): the GEMV's copies are bf16, the compiled layers
    equal the Python ones, and both equal the same step on float32 copies of the same values."""
    runner = _runner(family_checkpoint, name, bf16_values=True, decode_gemv="on")
    copies = runner.native_layers.weights[11::15]  # the qkv GEMV copy of every layer
    assert copies and {t.dtype for t in copies} == {torch.bfloat16}
    step = _decode_step([37, 1, 60, 24, 9], ctx_start=[0, 0, 16, 8, 0], seed=len(name))
    _assert_layers_equal(runner, step)
    input_ids, meta, _ = model_step_tensors(runner.model, step, CPU, paged_decode=True)
    pools = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in runner.kv.layers]
    with torch.inference_mode():
        x = runner.model.embed(input_ids)
        held = runner.native_layers(x, meta, [(k.clone(), v.clone()) for k, v in pools])
        float32_gemv_copies(runner.model, runner.native_layers)
        assert {t.dtype for t in runner.native_layers.weights[11::15]} == {torch.float32}
        assert torch.equal(runner.native_layers(x, meta, pools), held)
