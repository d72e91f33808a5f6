"""The MLP's row chunks on CPU (decoder.GatedMLP.forward): a long prefill split into cache-sized chunks gives every
row exactly the value the whole matrix gives, with each linear kernel the engine runs (MKL, oneDNN float32, oneDNN
bf16 beside float32 activations), fused (Phi-3) or not."""
from __future__ import annotations

import pytest
import torch

from backend.model import decoder
from backend.model.decoder import GatedMLP, cache_rows, row_chunks
from backend.model.features import MlpFeatures
from backend.model.prepacked_linear import bf16_linears_unavailable, onednn_unavailable, prepack_linears

KERNELS = ["torch", "onednn-float32", "onednn-bfloat16"]


def _mlp(kernel: str, fused: bool, activation: str) -> GatedMLP:
    torch.manual_seed(0)
    mlp = GatedMLP(MlpFeatures(hidden=96, intermediate=256, activation=activation, fused=fused))
    mlp.fuse()
    if kernel == "torch":
        return mlp
    reason = onednn_unavailable("cpu") if kernel == "onednn-float32" else bf16_linears_unavailable("cpu")
    if reason is not None:
        pytest.skip(reason)
    return prepack_linears(mlp, torch.bfloat16 if kernel.endswith("bfloat16") else None)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("fused", "activation"), [(False, "silu"), (True, "silu"), (False, "gelu_tanh")])
@pytest.mark.parametrize("tokens", [1, 63, 64, 65, 129, 1000])  # one chunk, exact multiples, remainders
def test_chunked_rows_equal_the_whole_matrix_bit_for_bit(monkeypatch, kernel, fused, activation, tokens):
    monkeypatch.setattr(decoder, "MLP_CHUNK_BYTES", 64 * 2 * 256 * 4)  # 64-row chunks at intermediate 256
    mlp = _mlp(kernel, fused, activation)
    x = torch.randn(tokens, 96)
    with torch.inference_mode():
        chunked, whole = mlp(x), mlp._forward(x)
    assert chunked.shape == (tokens, 96)
    assert torch.equal(chunked, whole)


def test_chunk_sizes():
    assert cache_rows(3072) == (4 << 20) // (2 * 3072 * 4) == 170  # the 125M Llama's MLP
    assert cache_rows(1 << 20) == 32  # never fewer rows than a GEMM uses well
    assert row_chunks(1, 170) == 1 and row_chunks(170, 170) == 1 and row_chunks(171, 170) == 2
    assert row_chunks(2047, 170) == 13  # 13 chunks of 157-158 rows, none a sliver
    assert {len(part) for part in torch.arange(2047).tensor_split(row_chunks(2047, 170))} == {157, 158}


def test_chunks_only_on_cpu_and_beyond_a_chunk(monkeypatch):
    mlp = _mlp("torch", False, "silu")
    calls = []
    monkeypatch.setattr(mlp, "_forward", lambda x: calls.append(len(x)) or x)
    mlp(torch.randn(cache_rows(256), 96))
    mlp(torch.randn(2 * cache_rows(256) + 1, 96))
    assert calls[0] == cache_rows(256) and len(calls) == 1 + 3


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["llama3", "phi3_4k", "gemma2", "qwen3", "qwen2_swa"])  # fused MLP, sandwich norms
def test_a_whole_prefill_in_row_chunks_equals_it_in_one_piece(family_checkpoint, monkeypatch, name, kernel):
    """Every layer's MLP in 32-row chunks: every logit of every position the same bit for bit, through the model's
    own prefill (scoring.window_logits: 2 prompts x 40 tokens, 80 rows), with each linear kernel."""
    from backend.model.loader import load_model
    from backend.model.prepacked_linear import prepack_linears
    from backend.model.scoring import window_logits

    model = load_model(family_checkpoint(name)[1], torch.device("cpu"))
    kv_dtype = torch.bfloat16 if kernel.endswith("bfloat16") else None  # bf16 linears keep bf16 K/V (the engine)
    if kernel != "torch":
        reason = onednn_unavailable("cpu") if kv_dtype is None else bf16_linears_unavailable("cpu")
        if reason is not None:
            pytest.skip(reason)
        model = prepack_linears(model, kv_dtype)
    windows = torch.randint(1, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        monkeypatch.setattr(decoder, "MLP_CHUNK_BYTES", 1 << 40)
        whole = window_logits(model, windows, kv_dtype)
        monkeypatch.setattr(decoder, "MLP_CHUNK_BYTES", 16 * 2 * model.transformer.layers[0].mlp.proj.in_features * 4)
        chunked = window_logits(model, windows, kv_dtype)
    assert torch.equal(chunked, whole)
