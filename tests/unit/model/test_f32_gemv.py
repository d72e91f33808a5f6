"""The float32 GEMV (backend/model/kernels/f32_gemv.cpp / .py), 1 to MAX_ROWS rows: its products against the exact
(float64) ones and against oneDNN's float32 linear (what it stands in for), each row's result independent of the
rows beside it, rows of x read at their stride, hostile values, weights held in bf16 where that is exact (the same
bits as their float32 copy), PrepackedLinear's choice of it (up to MAX_ROWS rows), the bytes its copies take, and
what it refuses."""
from __future__ import annotations

import pytest
import torch

from backend.model.kernels.f32_gemv import bf16_exact, f32_gemv, unsupported
from backend.model.kernels.gemv import MAX_ROWS, copy_bytes, gemv_copy, gemv_dtype, resolve_decode_gemv
from backend.model.prepacked_linear import PrepackedLinear, gemv_copy_bytes, prepack_linears
from tests.unit.model.bf16_values import round_to_bf16_values
from tests.unit.model.fused_mlp import FusedMlp

CPU = torch.device("cpu")
NO_GEMV = unsupported(CPU)
pytestmark = pytest.mark.skipif(NO_GEMV is not None, reason=f"float32 GEMV: {NO_GEMV}")
# (out, in): blocks of 8 outputs (one row) and of 3 with a 2-output tail, 37 outputs (a 1- and a 5-output tail) over a
# K with a 6-column tail, fewer columns than one vector, the 125M model's qkv and proj, a vocabulary-sized head
SHAPES = [(128, 32), (37, 70), (5, 3), (1280, 768), (768, 3072), (1000, 96)]


def _operands(n: int, k: int, bias: bool, seed: int, rows: int = 1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g) if bias else None
    return w, b, torch.randn(rows, k, generator=g)


def _float32_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(M, N): a float32 sum of K products may be off its exact value by about K ulps of the sum of |products|."""
    return (x.abs().double() @ w.abs().double().T) * (w.shape[1] * 2.0 ** -23) + 1e-30


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n, k", SHAPES)
def test_products_within_float32_summation_error_of_the_exact_ones(n, k, bias, rows):
    """rows: one row (8-output blocks), fewer rows than one pass, a pass of the 4-row tile and each remainder after
    one, the most it takes (four passes)."""
    w, b, x = _operands(n, k, bias, seed=n + k, rows=rows)
    got = f32_gemv(x, w, b)
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= _float32_error_bound(x, w) + (0 if b is None else 2.0 ** -23)).all()


@pytest.mark.parametrize("n, k", SHAPES)
def test_as_onednn_up_to_summation_order(n, k):
    """oneDNN's float32 linear (PrepackedLinear without the GEMV) sums the same products in another order."""
    w, b, x = _operands(n, k, True, seed=n * k, rows=MAX_ROWS)
    onednn, ours = PrepackedLinear(w, b)(x), f32_gemv(x, w, b)
    assert ((ours - onednn).abs().double() <= 2 * _float32_error_bound(x, w) + 2.0 ** -22).all()


def test_each_rows_result_is_the_same_whatever_rows_are_beside_it():
    """A sequence's logits must not depend on the batch it decodes in: one row alone (8-output blocks) and the same
    row at every place among 16 (3-output blocks, passes of 4 rows and remainders) give the same bits."""
    w, b, x = _operands(37, 70, True, seed=5, rows=MAX_ROWS)
    alone = torch.cat([f32_gemv(x[i:i + 1], w, b) for i in range(MAX_ROWS)])
    for rows in range(1, MAX_ROWS + 1):
        assert torch.equal(f32_gemv(x[:rows], w, b), alone[:rows]), rows


def test_rows_of_x_are_read_at_their_stride():
    """A view of wider rows (the q columns of a fused qkv, say) is read in place, as its contiguous copy."""
    w, b, _ = _operands(40, 24, True, seed=9)
    wide = torch.randn(5, 64)
    view = wide[:, 8:32]
    assert not view.is_contiguous()
    assert torch.equal(f32_gemv(view, w, b), f32_gemv(view.contiguous(), w, b))
    transposed = torch.randn(24, 3).T  # a column stride other than 1: copied first
    assert torch.equal(f32_gemv(transposed, w, b), f32_gemv(transposed.contiguous(), w, b))


def test_hostile_values_stay_in_their_row():
    w, b, x = _operands(37, 70, True, seed=11, rows=5)
    clean = f32_gemv(x, w, b)
    x[1, 3], x[3, :] = float("nan"), float("inf")
    got = f32_gemv(x, w, b)
    assert torch.isnan(got[1]).all() and torch.equal(got[[0, 2, 4]], clean[[0, 2, 4]])
    assert not torch.isfinite(got[3]).any()
    huge = torch.full((1, 70), 3e38)
    assert torch.equal(f32_gemv(huge, torch.ones(4, 70), None), torch.full((1, 4), float("inf")))


@pytest.mark.parametrize("rows", [1, 3, 4, 5, MAX_ROWS])
@pytest.mark.parametrize("n, k", SHAPES)
def test_bf16_held_weights_give_the_float32_products_bit_for_bit(n, k, rows):
    """Weights that bf16 holds exactly (a bf16 checkpoint widened to float32), read from a bf16 copy: each widened
    as it is read, the same sums in the same order as from the float32 copy (one row with its prefetch, passes of
    4 rows and their remainders, column tails past a multiple of 8)."""
    w, b, x = _operands(n, k, True, seed=n + 3 * k, rows=rows)
    w = w.to(torch.bfloat16).float()
    assert torch.equal(f32_gemv(x, w.to(torch.bfloat16), b), f32_gemv(x, w, b))
    assert torch.equal(f32_gemv(x, w.to(torch.bfloat16), None), f32_gemv(x, w, None))


def test_bf16_exact_is_every_value_or_none():
    w = (torch.randn(3000, 700) * 0.05).to(torch.bfloat16)  # 2.1M values: three slices of the check
    wide = w.float()
    assert bf16_exact(w) and bf16_exact(wide)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40]).to(torch.bfloat16).float()
    assert bf16_exact(special)  # signed zeros, infinities, NaN and subnormals of bf16 widen exactly
    for flat_index in (0, 1_048_575, 1_048_576, wide.numel() - 1):  # each slice's edges, the last value
        one_off = wide.clone()
        one_off.view(-1)[flat_index] = torch.tensor(0.1)  # 0.1 needs float32's mantissa
        assert not bf16_exact(one_off), flat_index
    assert not bf16_exact(wide.half()) and not bf16_exact(wide.double())  # other dtypes: not this kernel's copy
    assert gemv_copy(wide, torch.float32).dtype == torch.bfloat16 and copy_bytes(wide, torch.float32) == w.numel() * 2
    assert gemv_copy(wide + 1e-3, torch.float32).dtype == torch.float32
    assert copy_bytes(wide + 1e-3, torch.float32) == w.numel() * 4


def test_hostile_bf16_held_weights_are_read_as_their_values():
    """Infinities and NaN among the weights: a bf16 copy widens them to the float32 copy's values."""
    w, b, x = _operands(37, 70, True, seed=13, rows=4)
    w = w.to(torch.bfloat16).float()
    w[2, 5], w[7, 0], w[30, 69] = float("inf"), float("nan"), float("-inf")
    assert bf16_exact(w)
    torch.testing.assert_close(f32_gemv(x, w.to(torch.bfloat16), b), f32_gemv(x, w, b), rtol=0, atol=0,
                               equal_nan=True)


def test_prepacked_linear_takes_it_up_to_max_rows(monkeypatch):
    w, b, _ = _operands(160, 96, True, seed=1)
    with_gemv, plain = PrepackedLinear(w, b, gemv=True), PrepackedLinear(w, b)
    calls = []
    monkeypatch.setattr("backend.model.kernels.gemv.f32_gemv.f32_gemv", lambda *a: calls.append(a) or f32_gemv(*a))
    one, most, many = torch.randn(1, 96), torch.randn(MAX_ROWS, 96), torch.randn(MAX_ROWS + 1, 96)
    assert torch.equal(with_gemv(one), f32_gemv(one, w, b)) and len(calls) == 1
    assert torch.equal(with_gemv(most), f32_gemv(most, w, b)) and len(calls) == 2
    assert torch.equal(with_gemv(many), plain(many)) and len(calls) == 2  # oneDNN's packed copy serves 17 rows
    assert with_gemv(torch.randn(0, 96)).shape == (0, 160) and len(calls) == 2  # no rows: oneDNN's
    assert "gemv=True" in repr(with_gemv)


def test_the_copies_bytes():
    model = FusedMlp(proj_in=40)
    expected = gemv_copy_bytes(model)
    assert expected == (32 * 8 + 8 * 40) * 4  # fc_gate (32, 8) and proj (8, 40) as they are; fc / gate fused
    prepack_linears(model, gemv=True)
    held = [m.gemv for m in model.modules() if isinstance(m, PrepackedLinear) and m.gemv is not None]
    assert sum(t.numel() * t.element_size() for t in held) == expected and len(held) == 2
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in held)


def test_a_bf16_checkpoints_widened_linears_keep_bf16_copies():
    """A bf16 checkpoint run as a float32 model (linear_dtype 'float32'): oneDNN's packed weights are float32, the
    GEMV's copies bf16 (half the bytes planned and held), and the products those of the float32 copies."""
    model = FusedMlp(proj_in=40)
    round_to_bf16_values(model)
    expected = gemv_copy_bytes(model)
    assert expected == (32 * 8 + 8 * 40) * 2
    prepack_linears(model, gemv=True)
    held = [m for m in model.modules() if isinstance(m, PrepackedLinear)]
    assert sum(m.gemv.numel() * m.gemv.element_size() for m in held) == expected
    assert {m.gemv.dtype for m in held} == {torch.bfloat16} and {m.dtype for m in held} == {torch.float32}
    for lin in held:
        x = torch.randn(5, lin.in_features)
        assert torch.equal(lin(x), f32_gemv(x, lin.gemv.float(), lin.bias))  # the float32 copy of the same values


def test_the_kernel_refuses_what_it_cannot_read():
    w, b, x = _operands(37, 70, True, seed=3)
    for rows in (0, MAX_ROWS + 1):
        with pytest.raises(RuntimeError, match=rf"f32_gemv: x \(M, K\) float32 with 1 <= M <= {MAX_ROWS}"):
            f32_gemv(torch.randn(rows, 70), w, b)
    with pytest.raises(RuntimeError, match=r"f32_gemv: x \(M, K\) float32"):
        f32_gemv(x.double(), w, b)
    with pytest.raises(RuntimeError, match="f32_gemv: x has 20 columns, the weight 70"):
        f32_gemv(torch.randn(1, 20), w, b)
    with pytest.raises(RuntimeError, match=r"f32_gemv: bias \(N,\) float32"):
        f32_gemv(x, w, b[:5])
    with pytest.raises(RuntimeError, match=r"f32_gemv: weight \(N, K\) float32 or bfloat16, contiguous"):
        f32_gemv(x, w.T.contiguous().T, b)
    with pytest.raises(RuntimeError, match=r"f32_gemv: weight \(N, K\) float32 or bfloat16"):
        f32_gemv(x, w.to(torch.float16), b)


def test_where_it_is_chosen():
    assert gemv_dtype(None, torch.float32) == torch.float32  # a float32 checkpoint's linears
    assert gemv_dtype(torch.bfloat16, torch.float32) == torch.bfloat16  # bf16 linears beside float32 activations
    assert gemv_dtype(None, torch.bfloat16) is None  # a bf16 checkpoint as it is: bf16 activations
    assert resolve_decode_gemv("auto", CPU, torch.float32) is True
    assert resolve_decode_gemv("on", CPU, torch.float32) is True
    assert resolve_decode_gemv("off", CPU, torch.float32) is False
    assert "CPU only" in unsupported("meta")
