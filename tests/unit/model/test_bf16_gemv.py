"""The bf16 GEMV (backend/model/kernels/bf16_gemv.cpp / .py), 1 to MAX_ROWS rows: its layout, its products against
the exact product of the bf16-rounded operands and against oneDNN's bf16 linear (what it stands in for), each row's
result independent of the rows beside it, hostile values, PrepackedLinear's choice of it (up to MAX_ROWS rows), the
bytes its copies take, and every choice that cannot run refused with its reason."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.engine.config import EngineConfig
from backend.model.kernels import gemv as gemv_module
from backend.model.kernels.bf16_gemv import STRIP, bf16_gemv, interleave, interleaved_width, unsupported
from backend.model.kernels.gemv import MAX_ROWS, resolve_decode_gemv
from backend.model.prepacked_linear import PrepackedLinear, bf16_linears_unavailable, gemv_copy_bytes, prepack_linears
from tests.unit.model.fused_mlp import FusedMlp

CPU = torch.device("cpu")
NO_GEMV = unsupported(CPU) or bf16_linears_unavailable(CPU)
needs_gemv = pytest.mark.skipif(NO_GEMV is not None, reason=f"bf16 GEMV: {NO_GEMV}")
# (out, in): two full strips, a strip of 37 (a partial accumulator) and an odd K, 5 columns of a 3-wide K, the 125M
# model's proj, a vocabulary (a 40-column last strip), a strip and 1 (a 1-column last strip)
SHAPES = [(128, 32), (37, 70), (5, 3), (768, 3072), (1000, 96), (65, 9)]


def _operands(n: int, k: int, bias: bool, seed: int, rows: int = 1):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    return w, b, torch.randn(rows, k, generator=g)


def test_the_interleaved_layout():
    """Output columns (rows of w) in strips of STRIP, the last strip the rest; each strip's columns a K pair at a
    time, [K/2][columns][2]; an odd K padded with a zero column."""
    n, k = 2 * STRIP + 3, 71
    w = torch.arange(1, n * k + 1, dtype=torch.int16).view(torch.bfloat16).view(n, k)  # every value's bits distinct
    packed = interleave(w)
    assert packed.shape == (n, interleaved_width(k)) == (n, 72)
    flat, padded = packed.reshape(-1).view(torch.int16), F.pad(w, (0, 72 - k)).view(torch.int16)
    for row in range(n):
        for col in range(72):
            strip, c = divmod(row, STRIP)
            cols = min(STRIP, n - STRIP * strip)
            offset = strip * STRIP * 72 + (col // 2) * cols * 2 + c * 2 + col % 2
            assert flat[offset] == padded[row, col], (row, col)


@needs_gemv
@pytest.mark.parametrize("rows", [1, 3, 6, 7, MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n, k", SHAPES)
def test_products_within_bf16_rounding_of_the_exact_ones(n, k, bias, rows):
    """y = bf16(bf16(x) W^T + b): off the exact (float64) product of the rounded operands by the final rounding to
    bf16 (half a step: at most 2^-8 relative) plus float32 summation error; rows: one pass of the kernel's row tile
    (6), a pass and a remainder, the most it takes."""
    w, b, x = _operands(n, k, bias, seed=n + k, rows=rows)
    got = bf16_gemv(x, interleave(w), b)
    exact = x.to(torch.bfloat16).double() @ w.double().T + (0 if b is None else b.double())
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert torch.equal(got, got.to(torch.bfloat16).float())  # rounded to bf16
    assert ((got.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()


@needs_gemv
@pytest.mark.parametrize("n, k", SHAPES)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(n, k):
    """Every row is summed in one order whatever the number of rows: a sequence's products in a decode step of 16
    equal its products alone, bit for bit (and strided or non-contiguous inputs read as their values)."""
    w, b, x = _operands(n, k, True, seed=7 * n + k, rows=MAX_ROWS)
    packed = interleave(w)
    together = bf16_gemv(x, packed, b)
    for size in (1, 2, 5, 6, 11, MAX_ROWS):
        assert torch.equal(bf16_gemv(x[:size], packed, b), together[:size]), size
    assert torch.equal(torch.cat([bf16_gemv(x[i:i + 1], packed, b) for i in range(MAX_ROWS)]), together)
    assert torch.equal(bf16_gemv(x[::2], packed, b), together[::2])
    wide = torch.randn(MAX_ROWS, 2 * k)
    wide[:, ::2] = x
    assert torch.equal(bf16_gemv(wide[:, ::2], packed, b), together)


@needs_gemv
def test_x_is_rounded_to_bf16_as_torch_rounds_it():
    """The kernel rounds x itself: through an identity weight each output is bf16(x) exactly, ties to even included
    (values whose low 16 bits are 0x8000, above an even and an odd bf16), in rows of a K with a tail, strided rows."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(MAX_ROWS, 2 * 70, generator=g)[:, :70]  # rows 140 floats apart
    bits = x.view(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000  # exactly halfway between two bf16 values
    x = torch.where(torch.rand(x.shape, generator=g) < 0.3, ties.view(torch.float32), x)
    assert ((x.view(torch.int32) & 0x1FFFF) == 0x8000).any() and ((x.view(torch.int32) & 0x1FFFF) == 0x18000).any()
    got = bf16_gemv(x, interleave(torch.eye(70, dtype=torch.bfloat16)), None)
    assert torch.equal(got, x.to(torch.bfloat16).float())


@needs_gemv
def test_hostile_values_stay_in_their_row():
    """NaN and infinities in one row give what the exact product gives (NaN / inf) in that row only; the others are
    untouched; values past bf16's range round to infinity, as torch's rounding does."""
    w, b, x = _operands(37, 70, True, seed=11, rows=5)
    packed = interleave(w)
    clean = bf16_gemv(x, packed, b)
    x[1, 3], x[3, :] = float("nan"), float("inf")
    got = bf16_gemv(x, packed, b)
    assert torch.isnan(got[1]).all() and torch.equal(got[[0, 2, 4]], clean[[0, 2, 4]])
    assert not torch.isfinite(got[3]).any()
    huge = torch.full((1, 70), 3e38)
    assert torch.equal(bf16_gemv(huge, interleave(torch.ones(4, 70, dtype=torch.bfloat16)), None),
                       torch.full((1, 4), float("inf")))


@needs_gemv
@pytest.mark.parametrize("n, k", SHAPES)
def test_as_onednn_up_to_the_rounding_of_ties(n, k):
    """oneDNN's bf16 linear (PrepackedLinear without the GEMV) rounds the same float32 sums summed in another order:
    the results are equal but where a sum lies at a rounding boundary, then one bf16 step apart."""
    w, b, x = _operands(n, k, True, seed=n * k, rows=MAX_ROWS)
    onednn, ours = PrepackedLinear(w, b, torch.bfloat16)(x), bf16_gemv(x, interleave(w), b)
    step = onednn.abs() * 2 ** -7 + 1e-30
    assert ((ours - onednn).abs() <= step).all()
    assert (ours == onednn).float().mean() >= 0.99


@needs_gemv
def test_prepacked_linear_takes_it_up_to_max_rows(monkeypatch):
    w, b, _ = _operands(160, 96, True, seed=1)
    with_gemv, plain = PrepackedLinear(w, b, torch.bfloat16, gemv=True), PrepackedLinear(w, b, torch.bfloat16)
    calls = []
    monkeypatch.setattr("backend.model.kernels.gemv.bf16_gemv.bf16_gemv",
                        lambda *a: calls.append(a) or bf16_gemv(*a))
    one, most, many = torch.randn(1, 96), torch.randn(MAX_ROWS, 96), torch.randn(MAX_ROWS + 1, 96)
    assert torch.equal(with_gemv(one), bf16_gemv(one, with_gemv.gemv, b)) and len(calls) == 1
    assert torch.equal(with_gemv(most), bf16_gemv(most, with_gemv.gemv, b)) and len(calls) == 2
    assert torch.equal(with_gemv(many), plain(many)) and len(calls) == 2  # oneDNN's packed copy serves 17 rows
    assert with_gemv(torch.randn(0, 96)).shape == (0, 160) and len(calls) == 2  # no rows: oneDNN's
    assert torch.equal(with_gemv(one.to(torch.bfloat16)), plain(one.to(torch.bfloat16)))  # bf16 input: oneDNN's
    assert "gemv=True" in repr(with_gemv)


@needs_gemv
def test_the_copies_bytes():
    model = FusedMlp(proj_in=40)
    expected = gemv_copy_bytes(model, torch.bfloat16)
    assert expected == (32 * 8 + 8 * 40) * 2  # fc_gate (32, 8) and proj (8, 40), K even: no padding; fc / gate fused
    prepack_linears(model, torch.bfloat16, gemv=True)
    held = [m.gemv for m in model.modules() if isinstance(m, PrepackedLinear) and m.gemv is not None]
    assert sum(t.numel() * t.element_size() for t in held) == expected and len(held) == 2


@needs_gemv
def test_the_kernel_refuses_what_it_cannot_read():
    w, b, x = _operands(37, 70, True, seed=3)
    packed = interleave(w)
    for rows in (0, MAX_ROWS + 1):
        with pytest.raises(RuntimeError, match=rf"bf16_gemv: x \(M, K\) float32 with 1 <= M <= {MAX_ROWS}"):
            bf16_gemv(torch.randn(rows, 70), packed, b)
    with pytest.raises(RuntimeError, match=r"bf16_gemv: x \(M, K\) float32"):
        bf16_gemv(torch.randn(2, 70, dtype=torch.float64), packed, b)
    with pytest.raises(RuntimeError, match="bf16_gemv: x has 20 columns, the weight 70"):
        bf16_gemv(torch.randn(1, 20), packed, b)
    with pytest.raises(RuntimeError, match=r"bf16_gemv: bias \(N,\) bfloat16"):
        bf16_gemv(x, packed, b[:5])
    odd = torch.zeros(37, 71, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16_gemv: packed"):
        bf16_gemv(torch.randn(1, 71), odd, b)  # not padded to whole pairs
    with pytest.raises(RuntimeError, match="bf16_gemv: packed"):
        bf16_gemv(x, packed.float(), b)  # not bf16


def test_where_it_is_chosen(monkeypatch):
    with pytest.raises(ValueError, match="decode_gemv must be one of"):
        resolve_decode_gemv("fast", CPU, torch.bfloat16)
    assert resolve_decode_gemv("off", CPU, torch.bfloat16) is False
    assert resolve_decode_gemv("auto", CPU, None) is False  # bf16 activations (a bf16 checkpoint as it is)
    with pytest.raises(ValueError, match="decode_gemv 'on' is unavailable: the GEMV serves float32 linears and "
                                         "bfloat16 ones beside float32 activations"):
        resolve_decode_gemv("on", CPU, None)
    with pytest.raises(ValueError, match="decode_gemv 'on' is unavailable: the linears are not oneDNN-prepacked"):
        resolve_decode_gemv("on", CPU, torch.bfloat16, onednn=False)
    assert resolve_decode_gemv("auto", CPU, torch.float32, onednn=False) is False
    with pytest.raises(ValueError, match="the GEMV serves bfloat16 and float32 linears, not torch.float16"):
        PrepackedLinear(torch.randn(4, 8), None, torch.float16, gemv=True)
    monkeypatch.setattr(gemv_module.bf16_gemv, "unsupported", lambda device: "the bf16 GEMV needs AVX-512 BF16")
    assert resolve_decode_gemv("auto", CPU, torch.bfloat16) is False
    with pytest.raises(ValueError, match="decode_gemv 'on' is unavailable: the bf16 GEMV needs AVX-512 BF16"):
        resolve_decode_gemv("on", CPU, torch.bfloat16)
    monkeypatch.setattr(gemv_module.bf16_gemv, "unsupported", lambda device: None)
    assert resolve_decode_gemv("auto", CPU, torch.bfloat16) is True
    assert "CPU only" in unsupported("meta")


def test_the_config_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="decode_gemv must be one of"):
        EngineConfig(decode_gemv="yes")
    for other in (dict(linear_kernel="torch"), dict(device="cuda")):
        with pytest.raises(ValueError, match="decode_gemv 'on' serves oneDNN-prepacked linears on CPU"):
            EngineConfig(decode_gemv="on", **other)
