"""The compiled causal prefill kernel (backend/model/kernels/causal_prefill.cpp) against attention computed in float64
on the same bf16 inputs, on the metadata step_tensors builds: several prompts in one step, grouped and plain heads,
every head size it is built for, lengths around its 32-key blocks and 48-row work items; bad arguments refused by
name; and where the engine uses it.

The bound: the kernel rounds each softmax probability to bf16 (relative error at most 2^-8) before weighting the
values, the float64 reference does not, so each output element may differ by at most 2^-8 x the largest |value|
it weighs (the probabilities sum to 1), plus float32 accumulation far below that."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from backend.model.kernels.causal_prefill import HEAD_SIZES, causal_prefill, unsupported
from backend.model.rope import RopeSpec
from backend.model.rotary import RotaryEmbedding
from backend.model.step_inputs import StepInputs, step_tensors

CPU = torch.device("cpu")
REASON = unsupported(64, torch.bfloat16, CPU)
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"causal prefill kernel: {REASON}")
ROTARY = RotaryEmbedding(RopeSpec("default", 10000.0, 8, 4096), CPU)


def _prefill(lengths: list[int]) -> StepInputs:
    """Whole prompts from position 0, one step, each in its own slots."""
    end = torch.tensor(lengths)
    slots = torch.arange(len(lengths) * max(lengths)).view(len(lengths), max(lengths))
    return StepInputs.of(tokens=torch.zeros(sum(lengths), dtype=torch.long), start=torch.zeros_like(end), end=end,
                         sampled=torch.ones(len(lengths), dtype=torch.long), context_slots=slots)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of each [first, first + n) range in float64, queries rounded to bf16 as the kernel does."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for first, n in seqs.tolist():
        qs, ks, vs = (t[first:first + n].double().transpose(0, 1) for t in (q.bfloat16(), k, v))
        out[first:first + n] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                              enable_gqa=True).transpose(0, 1)
    return out


def _bound(v: torch.Tensor) -> float:
    return 2.0 ** -8 * v.float().abs().max().item() + 1e-5


@pytest.mark.parametrize("dim", HEAD_SIZES)
@pytest.mark.parametrize("heads,kv", [(12, 4), (4, 4), (8, 1)])
def test_equals_float64_attention_within_bf16_probabilities(dim, heads, kv):
    lengths = [1, 31, 32, 33, 47, 48, 49, 130]  # around the 32-key blocks and the 48-row work items
    _, meta, _ = step_tensors(_prefill(lengths), ROTARY, {None}, torch.float32, CPU, causal_prefill=True)
    assert meta.causal == {None} and meta.causal_seqs is not None
    T = sum(lengths)
    g = torch.Generator().manual_seed(dim + heads)
    q = 3 * torch.randn(T, heads, dim, generator=g)  # peaked and flat softmax rows alike
    k = torch.randn(T, kv, dim, generator=g).bfloat16()
    v = torch.randn(T, kv, dim, generator=g).bfloat16()
    scale = 1 / math.sqrt(dim)
    got = causal_prefill(q, k, v, meta.causal_seqs, scale)
    err = (got.double() - _reference(q, k, v, meta.causal_seqs, scale)).abs().max().item()
    assert got.dtype == torch.float32 and err <= _bound(v), err


def test_a_long_prompt_with_large_scores():
    """2,047 tokens (many key blocks: the running maximum moves, earlier sums are rescaled) and scores up to ~+-60:
    exp of the unshifted scores would overflow float32."""
    T, heads, kv, dim = 2047, 4, 2, 64
    g = torch.Generator().manual_seed(7)
    q = 8 * torch.randn(T, heads, dim, generator=g)
    k = torch.randn(T, kv, dim, generator=g).bfloat16()
    v = torch.randn(T, kv, dim, generator=g).bfloat16()
    seqs = torch.tensor([[0, T]])
    got = causal_prefill(q, k, v, seqs, 1 / math.sqrt(dim))
    assert torch.isfinite(got).all()
    assert (got.double() - _reference(q, k, v, seqs, 1 / math.sqrt(dim))).abs().max().item() <= _bound(v)


def test_rows_outside_every_range_are_zero_and_ranges_are_independent():
    """Tokens of one sequence never see another's keys: a sequence's output is the same alone or beside others."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(90, 4, 32, generator=g)
    k, v = torch.randn(90, 2, 32, generator=g).bfloat16(), torch.randn(90, 2, 32, generator=g).bfloat16()
    both = causal_prefill(q, k, v, torch.tensor([[0, 40], [50, 40]]), 0.2)
    alone = causal_prefill(q[50:], k[50:], v[50:], torch.tensor([[0, 40]]), 0.2)
    assert torch.equal(both[50:], alone) and not both[40:50].any()


@pytest.mark.parametrize("args,message", [
    (dict(k=torch.zeros(8, 2, 32)), "bfloat16 keys and values"),
    (dict(q=torch.zeros(8, 4, 32, dtype=torch.float64)), "float32 queries"),
    (dict(seqs=torch.tensor([[0, 9]])), "token range of sequence 0"),
    (dict(seqs=torch.tensor([[0, 4], [-1, 2]])), "token range of sequence 1"),
    (dict(seqs=torch.tensor([[0, 0]])), "token range of sequence 0"),
    (dict(seqs=torch.tensor([[0, 8]], dtype=torch.int32)), "seqs \\(B, 2\\) int64"),
    (dict(q=torch.zeros(8, 3, 32)), "shapes"),
    (dict(q=torch.zeros(8, 4, 24), k=torch.zeros(8, 2, 24, dtype=torch.bfloat16),
          v=torch.zeros(8, 2, 24, dtype=torch.bfloat16)), "head size 24"),
])
def test_refuses_bad_arguments_by_name(args, message):
    given = dict(q=torch.zeros(8, 4, 32), k=torch.zeros(8, 2, 32, dtype=torch.bfloat16),
                 v=torch.zeros(8, 2, 32, dtype=torch.bfloat16), seqs=torch.tensor([[0, 8]]))
    given.update(args)
    if given["v"].dtype != given["k"].dtype:
        given["v"] = given["v"].to(given["k"].dtype)
    with pytest.raises(RuntimeError, match=message):
        causal_prefill(given["q"], given["k"], given["v"], given["seqs"], 0.1)


def test_where_the_metadata_asks_for_it():
    """Ranges only for steps with a causal window: a continued prompt (context before its new tokens) and a
    window shorter than the prompt keep SDPA's masks."""
    _, meta, _ = step_tensors(_prefill([5, 3]), ROTARY, {None, 4}, torch.float32, CPU, causal_prefill=True)
    assert meta.causal == {None} and meta.causal_seqs.tolist() == [[0, 5], [5, 3]]
    _, meta, _ = step_tensors(_prefill([5, 3]), ROTARY, {None}, torch.float32, CPU)
    assert meta.causal_seqs is None  # not asked for
    continued = StepInputs.of(tokens=torch.zeros(4, dtype=torch.long), start=torch.tensor([6]), end=torch.tensor([10]),
                              sampled=torch.ones(1, dtype=torch.long), context_slots=torch.arange(10)[None])
    _, meta, _ = step_tensors(continued, ROTARY, {None}, torch.float32, CPU, causal_prefill=True)
    assert meta.causal == frozenset() and meta.causal_seqs is None


def test_unsupported_says_why():
    assert "not torch.float32" in unsupported(64, torch.float32, CPU)
    assert "head sizes" in unsupported(40, torch.bfloat16, CPU)
    assert "CPU only" in unsupported(64, torch.bfloat16, "cuda")
