"""RMSNorm computes HF's formulas bit for bit: Llama's (normalise in float32, cast, then weight * x) and Gemma's
(weight applied in float32, then cast), in float32 and bfloat16, for a decode row, a small batch and a prefill."""
import pytest
import torch

from backend.model.decoder import RMSNorm

EPS = 1e-5


def hf_llama(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def hf_gemma(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (h * w.float()).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 16, 333])
@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm_is_hf_bit_for_bit(dtype, tokens, gemma):
    g = torch.Generator().manual_seed(tokens)
    dim = 768 if tokens != 333 else 100  # 100: not a multiple of any vector width
    x = (torch.randn(tokens, dim, generator=g) * 3).to(dtype)
    norm = RMSNorm(dim, EPS, weight_in_float32=gemma)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g) + 1)
    norm = norm.to(dtype)
    want = (hf_gemma if gemma else hf_llama)(x, norm.weight.detach())
    with torch.inference_mode():
        got = norm(x)
    assert got.dtype == dtype
    assert torch.equal(got, want)
