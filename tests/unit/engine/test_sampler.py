"""Sampler: greedy, seeded sampling, top-k/top-p, masks (min_tokens, bad words), penalties; SamplingParams checks."""
from __future__ import annotations

import pytest
import torch

from backend.engine.sampler import argmax_rows, sample
from backend.engine.sampling_params import SamplingParams
from backend.errors import InvalidRequestError

VOCAB = 50


def logits_with(values: dict[int, float], fill: float = 0.0) -> torch.Tensor:
    """(1, VOCAB) logits: `fill` everywhere but at the given token ids."""
    row = torch.full((1, VOCAB), fill)
    for token, value in values.items():
        row[0, token] = value
    return row


def next_token(logits: torch.Tensor, seq) -> int:
    return sample(logits, [seq])[0].token


def draw_many(seq, logits: torch.Tensor, n: int) -> list[int]:
    """n tokens drawn from the same logits, appended to seq as generation would."""
    tokens = []
    for _ in range(n):
        token = next_token(logits, seq)
        seq.append(token, None)
        tokens.append(token)
    return tokens


def test_greedy_is_argmax_per_row(make_seq):
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    seqs = [make_seq(f"r{i}") for i in range(3)]
    assert [r.token for r in sample(logits, seqs)] == logits.argmax(dim=-1).tolist()
    assert all(r.log_prob is None for r in sample(logits, seqs))


def _hostile_rows(vocab: int) -> torch.Tensor:
    """Rows whose argmax is easy to get wrong: ties (first wins), NaN (torch takes the first NaN as the maximum),
    every value -inf, +inf beside ties, the maximum at either end, random values."""
    rows = torch.randn(9, vocab, generator=torch.Generator().manual_seed(2))
    rows[0, [i % vocab for i in (3, 7, vocab - 1)]] = 50.0
    rows[1, [(vocab - 1) // 2, vocab - 1]] = float("nan")
    rows[2] = float("-inf")
    rows[3, [i % vocab for i in (1, 2)]] = float("inf")
    rows[4, 0] = 99.0
    rows[5, vocab - 1] = 99.0
    rows[6] = 0.0
    return rows


@pytest.mark.parametrize("vocab", [1, 7, 50, 8192, 128_256])
def test_argmax_rows_is_torchs_argmax(vocab):
    rows = _hostile_rows(vocab)
    assert argmax_rows(rows) == rows.argmax(dim=-1).tolist()
    assert argmax_rows(rows.double()) == rows.argmax(dim=-1).tolist()
    wide = torch.cat([rows, rows], dim=1)[:, vocab:]  # a strided view, as a slice of a step's logits can be
    assert argmax_rows(wide) == wide.argmax(dim=-1).tolist()
    with torch.inference_mode():  # the engine's logits are inference tensors
        assert argmax_rows(rows.clone()) == rows.argmax(dim=-1).tolist()
    assert argmax_rows(rows.bfloat16()) == rows.bfloat16().argmax(dim=-1).tolist()


@pytest.mark.parametrize("options", [{"top_k": 1, "temperature": 1.5}, {"temperature": 0.0, "top_k": 5},
                                     {"temperature": 0.7}])
def test_options_that_mean_greedy_pick_the_argmax(make_seq, options):
    seq = make_seq(max_tokens=20, **options)
    assert seq.request.sampling.greedy
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    assert draw_many(seq, logits, 20) == [int(logits.argmax())] * 20


def test_log_probs_are_of_the_unmodified_distribution(make_seq):
    logits = logits_with({3: 2.0, 4: 1.0})
    seq = make_seq(return_log_probs=True, bad_words=((3,),))
    result = sample(logits, [seq])[0]
    assert result.token == 4
    assert result.log_prob == pytest.approx(float(torch.log_softmax(logits[0], -1)[4]))


def test_same_seed_same_tokens_different_seeds_differ(make_seq):
    logits = torch.zeros(1, VOCAB)  # uniform: every draw is up to the RNG
    runs = {seed: [draw_many(make_seq(max_tokens=64, top_k=VOCAB, seed=seed), logits, 64) for _ in range(2)]
            for seed in (1, 2)}
    assert runs[1][0] == runs[1][1] and runs[2][0] == runs[2][1]
    assert runs[1][0] != runs[2][0]
    assert len(set(runs[1][0])) > 10  # it really samples


def test_seeded_draws_do_not_depend_on_the_batch(make_seq):
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2))
    alone = draw_many(make_seq("a", max_tokens=16, top_k=10, seed=7), logits, 16)
    a, other = make_seq("a", max_tokens=16, top_k=10, seed=7), make_seq("b", max_tokens=16, top_k=10, seed=8)
    batched = []
    for _ in range(16):
        ra, rb = sample(logits.repeat(2, 1), [a, other])
        a.append(ra.token, None)
        other.append(rb.token, None)
        batched.append(ra.token)
    assert batched == alone


def test_top_k_limits_the_candidates(make_seq):
    logits = torch.arange(VOCAB, dtype=torch.float32)[None] / 10  # top 3: 49, 48, 47
    tokens = draw_many(make_seq(max_tokens=200, top_k=3, seed=0), logits, 200)
    assert set(tokens) == {47, 48, 49}


def test_tiny_top_p_is_argmax(make_seq):
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3))
    for seed in range(10):
        seq = make_seq(max_tokens=5, top_p=1e-6, seed=seed)
        assert not seq.request.sampling.greedy
        assert draw_many(seq, logits, 5) == [int(logits.argmax())] * 5


def test_top_p_keeps_the_smallest_prefix_reaching_p(make_seq):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    tokens = draw_many(make_seq(max_tokens=200, top_p=0.75, seed=0), logits, 200)
    assert set(tokens) == {0, 1}  # 0.5 < 0.75 <= 0.5 + 0.3


def test_min_tokens_masks_end_id(make_seq):
    logits = logits_with({0: 5.0, 9: 1.0})
    seq = make_seq(max_tokens=10, end_id=0, min_tokens=2)
    assert draw_many(seq, logits, 2) == [9, 9]
    assert next_token(logits, seq) == 0
    assert next_token(logits, make_seq(max_tokens=10, min_tokens=2)) == 0  # no end_id: nothing to mask


def test_bad_word_masks_its_last_token_when_the_prefix_matches(make_seq):
    logits = logits_with({7: 5.0, 8: 1.0})
    bad = ((5, 7),)
    assert next_token(logits, make_seq(prompt_ids=(1, 5), bad_words=bad)) == 8
    assert next_token(logits, make_seq(prompt_ids=(5, 1), bad_words=bad)) == 7  # prefix is not the suffix
    assert next_token(logits, make_seq(prompt_ids=(1, 2), bad_words=((3,), (7,)))) == 8  # single tokens: always


def test_repetition_penalty_lowers_seen_tokens(make_seq):
    positive = logits_with({1: 3.0, 2: 2.5})
    assert next_token(positive, make_seq(prompt_ids=(1,), repetition_penalty=2.0)) == 2  # 3.0 / 2 < 2.5
    assert next_token(positive, make_seq(prompt_ids=(1,), repetition_penalty=1.1)) == 1  # 3.0 / 1.1 > 2.5
    negative = logits_with({1: -1.0, 2: -1.5}, fill=-10.0)
    assert next_token(negative, make_seq(prompt_ids=(1,), repetition_penalty=2.0)) == 2  # -1.0 * 2 < -1.5
    assert next_token(positive, make_seq(prompt_ids=(1,), repetition_penalty=0.5)) == 1  # < 1 rewards


def test_presence_penalty_counts_generated_tokens_once(make_seq):
    logits = logits_with({1: 3.0, 2: 2.5})
    assert next_token(logits, make_seq(prompt_ids=(1,), presence_penalty=1.0)) == 1  # the prompt does not count
    seq = make_seq(prompt_ids=(3,), max_tokens=8, presence_penalty=1.0)
    seq.append(1, None)
    assert next_token(logits, seq) == 2
    seq = make_seq(prompt_ids=(3,), max_tokens=8, presence_penalty=0.3)
    for _ in range(3):
        seq.append(1, None)
    assert next_token(logits, seq) == 1  # 3.0 - 0.3 whatever the count


def test_frequency_penalty_grows_with_the_count(make_seq):
    logits = logits_with({1: 3.0, 2: 2.5})
    for count, expected in ((1, 1), (3, 2)):  # 3.0 - 0.2 * count vs 2.5
        seq = make_seq(prompt_ids=(3,), max_tokens=8, frequency_penalty=0.2)
        for _ in range(count):
            seq.append(1, None)
        assert next_token(logits, seq) == expected
    seq = make_seq(prompt_ids=(3,), max_tokens=8, frequency_penalty=-1.0)
    seq.append(2, None)
    assert next_token(logits, seq) == 2  # negative: rewards repetition


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be > 0, got 0"),
        ({"max_tokens": -3}, "max_tokens must be > 0, got -3"),
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"min_tokens": -1}, "min_tokens must be >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"stop_words": ((1,), ())}, "stop_words contains an empty word"),
        ({"bad_words": ((),)}, "bad_words contains an empty word"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**{"max_tokens": 4, **kwargs})


def test_top_log_probs_come_from_the_unmodified_distribution(make_seq):
    """num_top_log_probs: the k most likely tokens before temperature / penalties / masks, highest first."""
    logits = logits_with({7: 5.0, 3: 4.0, 9: 3.0})
    seq = make_seq("t", temperature=0.5, top_k=2, seed=1, repetition_penalty=1.5, num_top_log_probs=3)
    result = sample(logits, [seq])[0]
    expected = torch.log_softmax(logits[0], dim=-1)
    assert [t for t, _ in result.top] == [7, 3, 9]
    assert [lp for _, lp in result.top] == pytest.approx([float(expected[t]) for t in (7, 3, 9)])
    assert result.log_prob is None  # return_log_probs was not asked
    plain = make_seq("p")
    assert sample(logits, [plain])[0].top == ()


def test_num_top_log_probs_is_bounded():
    with pytest.raises(InvalidRequestError, match="num_top_log_probs must be in"):
        SamplingParams(max_tokens=1, num_top_log_probs=21)
