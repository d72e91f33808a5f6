"""The K/V lines the proj GEMV asks for ahead of the next layer's attention (backend/model/kernels/pool_lines.h):
every line of every context row the attention reads, K rows before V rows, sequence by sequence, and nothing else;
column ranges clamped to the context (the attention refuses bad ones itself, later); rows that start inside a cache
line; nothing where the tensors are not laid out as the attention requires; a bf16 GEMV asking for them gives the
bits it gives without."""
from __future__ import annotations

import pytest
import torch

from backend.model.kernels.bf16_gemv import bf16_gemv, interleave, unsupported
from backend.model.kernels.build import load
from backend.model.prepacked_linear import bf16_linears_unavailable

LINE = 64
NO_GEMV = unsupported(torch.device("cpu")) or bf16_linears_unavailable(torch.device("cpu"))


def _expected(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, start: list[int], end: list[int], first: int,
              last: int) -> list[tuple[int, int]]:
    """(pool, byte offset from the pool's first byte) of each line, in the order the walk should give them."""
    row_bytes = k.shape[1] * k.shape[2] * k.element_size()
    out = []
    for b in range(first, min(last, slots.shape[0])):
        cols = range(max(0, start[b]), min(slots.shape[1], end[b]))
        for pool, tensor in ((0, k), (1, v)):
            base = tensor.data_ptr()
            for c in cols:
                row = base + int(slots[b, c]) * row_bytes
                line = row - row % LINE
                while line < row + row_bytes:
                    out.append((pool, line - base))
                    line += LINE
    return out


def _pools(rows: int, kv: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows, kv, dim, dtype=dtype), torch.zeros(rows, kv, dim, dtype=dtype)


@pytest.mark.parametrize("kv,dim,dtype", [(4, 64, torch.bfloat16), (2, 32, torch.float32), (1, 40, torch.float32),
                                          (3, 6, torch.bfloat16)])
@pytest.mark.parametrize("first,last", [(0, 4), (0, 2), (2, 4), (3, 9)])
def test_every_line_of_each_sequence_k_rows_then_v_rows(kv, dim, dtype, first, last):
    g = torch.Generator().manual_seed(kv * 100 + dim)
    k, v = _pools(256, kv, dim, dtype)
    slots = torch.randperm(256, generator=g)[:4 * 24].view(4, 24).contiguous()
    # whole contexts, a window, one row, and a range past both ends (clamped)
    start, end = [0, 10, 23, -5], [24, 17, 24, 40]
    got = load().pool_lines(k, v, slots, torch.tensor(start), torch.tensor(end), first, last)
    assert [tuple(r) for r in got.tolist()] == _expected(k, v, slots, start, end, first, last)


def test_empty_and_reversed_ranges_give_no_lines():
    k, v = _pools(64, 2, 32, torch.bfloat16)
    slots = torch.arange(32).view(2, 16).contiguous()
    got = load().pool_lines(k, v, slots, torch.tensor([5, 9]), torch.tensor([5, 3]), 0, 2)
    assert got.shape == (0, 2)


@pytest.mark.parametrize("case", ["strided slots", "int32 columns", "pools of two shapes", "column count"])
def test_nothing_asked_for_where_the_layout_is_not_the_attention_one(case):
    k, v = _pools(64, 2, 32, torch.bfloat16)
    slots = torch.arange(32).view(2, 16).contiguous()
    start, end = torch.tensor([0, 0]), torch.tensor([16, 16])
    if case == "strided slots":
        slots = torch.arange(64).view(2, 32)[:, ::2]
    elif case == "int32 columns":
        start = start.int()
    elif case == "pools of two shapes":
        v = torch.zeros(64, 2, 16, dtype=torch.bfloat16)
    else:
        end = torch.tensor([16, 16, 16])
    assert load().pool_lines(k, v, slots, start, end, 0, 2).shape == (0, 2)


@pytest.mark.skipif(NO_GEMV is not None, reason=f"bf16 GEMV: {NO_GEMV}")
@pytest.mark.parametrize("rows", [1, 6, 7, 16])
@pytest.mark.parametrize("sequences", [1, 3, 16])
def test_a_gemv_asking_for_the_lines_gives_the_same_bits(rows, sequences):
    """The 125M model's proj shape; every row count's passes (one pass up to 6 rows, which asks for nothing), as
    many sequences as rows or fewer, a window and a range past the context's end."""
    g = torch.Generator().manual_seed(rows * 31 + sequences)
    w = (torch.randn(768, 3072, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(rows, 3072, generator=g)
    k, v = _pools(4096, 4, 64, torch.bfloat16)
    slots = torch.randperm(4096, generator=g)[:sequences * 200].view(sequences, 200).contiguous()
    start = torch.tensor([(7 * b) % 50 for b in range(sequences)])
    end = torch.tensor([200 - (b % 3) + (b % 2) * 90 for b in range(sequences)])
    packed = interleave(w)
    assert torch.equal(load().bf16_gemv_rows_ahead(x, packed, k, v, slots, start, end), bf16_gemv(x, packed, None))
