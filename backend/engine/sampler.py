"""Next-token choice from logits: penalties, masks, temperature, top-k, top-p, per-request seeded RNG.

Numerically safe for every value SamplingParams accepts: scaled logits are clamped to the finite float range (a
masked -inf stays -inf), and temperature divides as TensorRT-LLM's kernel does, by t + 1e-6. A row that still
cannot be sampled (e.g. every token masked) fails alone: its SampleResult carries the error and the other rows of
the step are unaffected.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.engine.sequence import Sequence, TopLogProbs

_TEMPERATURE_EPS = 1e-6  # TensorRT-LLM's: logits * 1 / (t + 1e-6)


class SamplingError(RuntimeError):
    """One request's row could not be sampled (its request fails; the step goes on for the others)."""


@dataclass(frozen=True)
class SampleResult:
    token: int
    log_prob: float | None  # log-probability of the token under the unmodified model distribution
    error: str | None = None  # set when this row failed: token is then meaningless
    top: TopLogProbs = ()  # the num_top_log_probs most likely tokens under that same distribution


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
    """logits (S, vocab) float32, row i for seqs[i]."""
    wants = any(s.request.sampling.return_log_probs or s.request.sampling.num_top_log_probs for s in seqs)
    log_probs = torch.log_softmax(logits, dim=-1) if wants else None
    argmax = argmax_rows(logits)  # one call for the common case: greedy, nothing masked
    results = []
    for i, seq in enumerate(seqs):
        try:
            token = _choose(logits, i, argmax[i], seq)
        except Exception as exc:  # noqa: BLE001 -- one request's failure must not fail the step's other rows
            results.append(SampleResult(0, None, f"sampling failed for this request: {exc}"))
            continue
        sampling = seq.request.sampling
        lp = float(log_probs[i, token]) if log_probs is not None and sampling.return_log_probs else None
        k = sampling.num_top_log_probs
        results.append(SampleResult(token, lp, top=_top(log_probs[i], k) if k else ()))
    return results


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """logits (S, vocab) -> each row's first index of its maximum (a NaN counts as the maximum, as in torch).
    On CPU through NumPy's vectorised argmax: torch's CPU argmax runs at ~2 values a nanosecond, 61 us for 16 rows of
    8,192 and 1.2 ms for 16 rows of Llama 3's 128,256 on the development CPU, NumPy's in 9 us / 131 us
    (perf/ISSUE16.md); the same answer, ties and NaN included (tests/unit/engine/test_sampler.py)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def _top(log_probs: torch.Tensor, k: int) -> TopLogProbs:
    """The k most likely tokens of one row (vocab,) of log-probs, highest first."""
    values, ids = torch.topk(log_probs, min(k, log_probs.shape[0]))
    return tuple(zip(ids.tolist(), values.tolist()))


def _choose(logits: torch.Tensor, i: int, argmax: int, seq: Sequence) -> int:
    """Row i's token; the row is taken out of logits (S, vocab) only where it is needed (~1.5 us an indexing, a
    quarter of a greedy batch-16 step's sampling)."""
    sampling = seq.request.sampling
    if sampling.greedy and not _has_controls(seq):
        return argmax
    row = _apply_controls(logits[i].clone(), seq)
    if sampling.greedy:
        if bool(torch.isneginf(row).all()):
            raise SamplingError("every token is masked (bad_words / min_tokens)")
        return argmax_rows(row[None])[0]
    return _draw(row, seq)


def _has_controls(seq: Sequence) -> bool:
    sampling = seq.request.sampling
    min_tokens_active = sampling.end_id is not None and seq.num_output_tokens < sampling.min_tokens
    return sampling.uses_penalties or min_tokens_active or bool(sampling.bad_words)


def _finite(row: torch.Tensor) -> torch.Tensor:
    """Overflowed values (a huge penalty, a tiny temperature) clamped to the largest floats; -inf masks kept."""
    info = torch.finfo(row.dtype)
    return torch.nan_to_num(row, nan=float("-inf"), posinf=info.max, neginf=float("-inf"))


def _apply_controls(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    sampling = seq.request.sampling
    if sampling.uses_penalties:
        row = _finite(_penalise(row, seq))
    if sampling.end_id is not None and seq.num_output_tokens < sampling.min_tokens:
        row[sampling.end_id] = float("-inf")
    for word in sampling.bad_words:
        prefix = word[:-1]
        if not prefix or tuple(seq.token_ids[-len(prefix) :]) == prefix:
            row[word[-1]] = float("-inf")
    return row


def _penalise(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    sampling = seq.request.sampling
    vocab = row.shape[0]
    if sampling.repetition_penalty != 1.0:
        # As HF/TRT-LLM: divide positive logits, multiply negative ones, for every token of prompt and output.
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[torch.tensor(seq.token_ids, dtype=torch.long, device=row.device)] = True
        penalised = torch.where(row > 0, row / sampling.repetition_penalty, row * sampling.repetition_penalty)
        row = torch.where(seen, penalised, row)
    if seq.num_output_tokens and (sampling.presence_penalty or sampling.frequency_penalty):
        # As vLLM/OpenAI: presence and frequency count generated tokens only.
        out = torch.tensor(seq.output_ids, dtype=torch.long, device=row.device)
        counts = torch.bincount(out, minlength=vocab).to(row.dtype)
        row = row - sampling.presence_penalty * (counts > 0).to(row.dtype) - sampling.frequency_penalty * counts
    return row


def _draw(row: torch.Tensor, seq: Sequence) -> int:
    sampling = seq.request.sampling
    row = _finite(row / (sampling.temperature + _TEMPERATURE_EPS))
    if sampling.top_k > 0 and sampling.top_k < row.shape[0]:
        kth = torch.topk(row, sampling.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        raise SamplingError("no token has a finite probability (every token masked?)")
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= sampling.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs.cpu(), 1, generator=seq.generator))
