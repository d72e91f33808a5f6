"""The decoder layers' one-pass row operations (backend/model/kernels/row_ops.cpp): RMS norm, the residual add with
it, and SiLU(gate) * up, bit for bit the ATen operations backend/model/decoder.py runs, over row lengths that reach
each level of ATen's cascaded sum (and the vectors and floats left over) and of its
elementwise loop (16-float runs, scalar tails, the split between threads), hostile values, and what they refuse."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.model.decoder import RMSNorm
from backend.model.kernels.build import KernelUnavailable, load
from build_engines.training import torch_threads


def _kernels():
    try:
        return load()
    except KernelUnavailable:
        return None


KERNELS = _kernels()
BUILT = pytest.mark.skipif(KERNELS is None, reason="the kernels did not build here")
NORMS = pytest.mark.skipif(KERNELS is None or not KERNELS.norm_rows_exact(),
                           reason="norms: no kernels, or ATen runs other than its AVX2 or AVX-512 kernels here")
SILU = pytest.mark.skipif(KERNELS is None or not KERNELS.silu_rows_exact(),
                          reason="SiLU: no kernels, or ATen runs other than its AVX2 or AVX-512 kernels here")
# under one vector, a vector and floats left over, rows of 4 vectors and vectors left over, the demo and 125M hidden
# sizes (the 125M's 24 rows of 4 vectors carry once to the cascade's second level), a 5120 one, sums carried to the
# third level (8192: 256 rows; 65536 + tails: 2048 rows) and to the fourth (4096 rows and more)
NORM_SIZES = [5, 13, 40, 96, 256, 768, 1000, 5120, 8192, 65536 + 8 * 3 + 5, 131072 + 8 * 3 + 5]


def _rows(t: int, n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, n, generator=g) * scale


def _norm(n: int, eps: float, weight_in_float32: bool, seed: int) -> RMSNorm:
    norm = RMSNorm(n, eps, weight_in_float32)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(seed)))
    return norm


@NORMS
@pytest.mark.parametrize("weight_in_float32", [False, True])
@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize("n", NORM_SIZES)
def test_rms_norm_is_the_python_norm_bit_for_bit(n, t, weight_in_float32):
    norm = _norm(n, 1e-6 if weight_in_float32 else 1e-5, weight_in_float32, seed=n)
    x = _rows(t, n, seed=n + t)
    with torch.no_grad():
        want = norm(x)
    assert torch.equal(KERNELS.rms_norm_rows(x, norm.weight.detach(), norm.eps), want)


@NORMS
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("t, n", [(2048, 768), (1000, 40), (5, 5120), (77, 2007)])
def test_rms_norm_of_a_prefill_s_rows_split_between_threads(t, n, threads):
    """Rows of ATen's grain or more between them are normed on both threads, each row whole: ATen's bits."""
    norm = _norm(n, 1e-5, False, seed=n)
    x = _rows(t, n, seed=t)
    with torch_threads(threads), torch.no_grad():
        want = norm(x)
        got = KERNELS.rms_norm_rows(x, norm.weight.detach(), norm.eps)
    assert torch.equal(got, want)


@NORMS
@pytest.mark.parametrize("weight_in_float32", [False, True])
def test_rmsnorm_with_the_one_pass_form_is_rmsnorm(weight_in_float32):
    """RMSNorm.one_pass (set by decode_layers.one_pass_norms) over float32 rows; anything else keeps ATen's form."""
    norm = _norm(768, 1e-6, weight_in_float32, seed=9)
    x = _rows(300, 768, seed=10)
    with torch.no_grad():
        want, want_3d = norm(x), norm(x.view(100, 3, 768))
        calls = []
        norm.one_pass = lambda *args: calls.append(1) or KERNELS.rms_norm_rows(*args)
        assert torch.equal(norm(x), want) and calls == [1]
        assert torch.equal(norm(x.view(100, 3, 768)), want_3d) and calls == [1]  # (q / k norms' heads): ATen
        assert torch.equal(norm(x.bfloat16()), _norm(768, 1e-6, weight_in_float32, seed=9)(x.bfloat16()))
        assert calls == [1]


@NORMS
@pytest.mark.parametrize("scale", [1e-20, 1e-3, 1e3, 1e18])
def test_rms_norm_of_hostile_magnitudes_and_zero_rows(scale):
    """Tiny rows (eps dominates), huge ones (squares near float32's top), a zero row, one with an inf square."""
    n = 768
    norm = _norm(n, 1e-5, False, seed=1)
    x = _rows(4, n, seed=2, scale=scale)
    x[1] = 0
    x[2, 7] = 3e38
    with torch.no_grad():
        want = norm(x)
    assert torch.equal(KERNELS.rms_norm_rows(x, norm.weight.detach(), norm.eps), want)


@NORMS
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("n", [40, 256, 768, 5120])
def test_add_rms_norm_is_the_add_then_the_python_norm(n, t):
    norm = _norm(n, 1e-5, False, seed=n)
    x, delta = _rows(t, n, seed=1), _rows(t, n, seed=2)
    with torch.no_grad():
        want_sum = x + delta
        want = norm(want_sum)
    got_sum, got = KERNELS.add_rms_norm_rows(x, delta, norm.weight.detach(), norm.eps)
    assert torch.equal(got_sum, want_sum) and torch.equal(got, want)


@SILU
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("t", [1, 5, 13, 16])
@pytest.mark.parametrize("inter", [8, 17, 40, 1024, 2007, 3072, 11008])
def test_silu_mul_is_the_python_mlp_bit_for_bit(inter, t, threads):
    """Halves of a (T, 2 I) product as decoder.Mlp takes them; at 2 threads the rows of ATen's SiLU over 32768 or more
    floats are split between threads, mid-row where T is odd (13 x 3072, 13 x 2007: a split off the 16-float runs)."""
    with torch_threads(threads):
        fc = _rows(t, 2 * inter, seed=inter + t, scale=4.0)
        gate, up = fc.chunk(2, dim=-1)
        want = F.silu(gate) * up
        got = KERNELS.silu_mul_rows(gate, up)
    assert torch.equal(got, want)


@SILU
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("t, inter", [(1, 40), (17, 17), (158, 3072), (33, 2007), (300, 1024)])
def test_silu_mul_of_a_bf16_product_is_the_widened_mlp_rounded(t, inter, threads):
    """A bf16 linear's (T, 2 I) output as GatedMLP takes it beside float32 activations: widened, silu(fc) * gate,
    rounded to bf16 for proj; over ATen's grain the rows split between threads (odd T: mid-row), hostile values in."""
    both = (_rows(t, 2 * inter, seed=t + inter, scale=4.0)).bfloat16()
    both[0, :4] = torch.tensor([float("nan"), float("inf"), -100.0, 0.0])
    both[-1, inter:inter + 3] = torch.tensor([float("inf"), float("nan"), -0.0])
    with torch_threads(threads):
        fc, gate = both.float().chunk(2, dim=-1)
        want = (F.silu(fc) * gate).bfloat16()
        got = KERNELS.silu_mul_bf16_rows(both)
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))


@SILU
def test_silu_mul_of_hostile_values():
    """exp(-x) overflowing (x = -100: -0), vanishing (x = 100), infinities and NaN in both halves."""
    fc = _rows(2, 2 * 40, seed=3)
    fc[0, :6] = torch.tensor([-100.0, 100.0, float("inf"), float("-inf"), 0.0, -0.0])
    fc[1, 40:43] = torch.tensor([float("nan"), float("inf"), 0.0])
    fc[1, 0] = float("nan")
    gate, up = fc.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = KERNELS.silu_mul_rows(gate, up)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got.signbit(), want.signbit())


@NORMS
def test_the_longest_rows_the_sum_follows():
    """Up to 2^19 rows of 4 vectors ATen's cascade steps by 16 (level_power 4); beyond, by 32, an order the sum does
    not follow: refused by name, not summed in another order. ATen at one thread: a lone row this long may be summed
    in parts between threads, which decode_layers.cpp keeps to ATen for (rows of its grain or more)."""
    longest = 2 ** 19 * 32
    norm = _norm(longest, 1e-5, False, seed=4)
    x = _rows(1, longest, seed=5)
    with torch_threads(1), torch.no_grad():
        want = norm(x)
    assert torch.equal(KERNELS.rms_norm_rows(x, norm.weight.detach(), norm.eps), want)
    over = torch.ones(1, longest + 32)
    with pytest.raises(RuntimeError, match=f"rows of {longest + 32} floats are longer than this sum reproduces"):
        KERNELS.rms_norm_rows(over, torch.ones(longest + 32), 1e-5)


@BUILT
def test_what_the_row_operations_refuse():
    w = torch.ones(8)
    with pytest.raises(RuntimeError, match=r"x \(T, n\) float32"):
        KERNELS.rms_norm_rows(torch.ones(2, 8, dtype=torch.float64), w, 1e-5)
    with pytest.raises(RuntimeError, match=r"norm weight \(8,\) float32"):
        KERNELS.rms_norm_rows(torch.ones(2, 8), torch.ones(9), 1e-5)
    with pytest.raises(RuntimeError, match="differ in shape"):
        KERNELS.add_rms_norm_rows(torch.ones(2, 8), torch.ones(3, 8), w, 1e-5)
    with pytest.raises(RuntimeError, match="differ in shape"):
        KERNELS.silu_mul_rows(torch.ones(2, 8), torch.ones(2, 9))
    with pytest.raises(RuntimeError, match="contiguous rows"):
        KERNELS.silu_mul_rows(torch.ones(8, 2).T, torch.ones(2, 8))
