"""Engine-level isolation: a request whose sampling fails, or a step whose forward pass fails, fails only those
requests; the engine frees what they held and keeps serving everyone else exactly (issue 11 item 2)."""
from __future__ import annotations

import math

import pytest
import torch

from backend.engine import sampler
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Request
from backend.errors import InvalidRequestError


def _outputs_by_id(engine, requests):
    for r in requests:
        engine.add_request(r)
    got = {r.request_id: [] for r in requests}
    while engine.has_work():
        for out in engine.step():
            got[out.request_id].append(out)
    return got


def test_a_row_whose_sampling_raises_fails_alone(make_engine, prompts, hf_greedy, kv_idle, monkeypatch):
    engine = make_engine()
    ps = prompts([6, 9, 12], engine.vocab_size, seed=5)
    requests = [Request(f"r{i}", p, SamplingParams(max_tokens=8, top_k=5 if i == 1 else 0, seed=1))
                for i, p in enumerate(ps)]
    real_draw = sampler._draw

    def draw(row, seq):
        if seq.request_id == "r1" and seq.num_output_tokens == 3:
            raise RuntimeError("probability tensor contains nan")
        return real_draw(row, seq)

    monkeypatch.setattr(sampler, "_draw", draw)
    got = _outputs_by_id(engine, requests)
    failed = got["r1"][-1]
    assert failed.finished and failed.finish_reason is FinishReason.ERROR
    assert "probability tensor contains nan" in failed.error
    assert sum(len(o.new_token_ids) for o in got["r1"]) == 3  # what it had before the failure
    for i in (0, 2):
        assert [t for o in got[f"r{i}"] for t in o.new_token_ids] == hf_greedy(ps[i], 8)
        assert got[f"r{i}"][-1].error is None
    kv_idle(engine.blocks)


def test_a_failing_forward_fails_its_batch_and_the_engine_goes_on(make_engine, prompts, hf_greedy, kv_idle,
                                                                  monkeypatch):
    engine = make_engine()
    ps = prompts([5, 7, 11], engine.vocab_size, seed=6)
    real_run, calls = engine.runner.run, []

    def run(inputs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access")
        return real_run(inputs)

    monkeypatch.setattr(engine.runner, "run", run)
    got = _outputs_by_id(engine, [Request(f"r{i}", p, SamplingParams(max_tokens=6)) for i, p in enumerate(ps[:2])])
    assert all(outs[-1].finish_reason is FinishReason.ERROR and "illegal memory access" in outs[-1].error
               for outs in got.values())
    kv_idle(engine.blocks)
    after = _outputs_by_id(engine, [Request("next", ps[2], SamplingParams(max_tokens=6))])
    assert [t for o in after["next"] for t in o.new_token_ids] == hf_greedy(ps[2], 6)


@pytest.mark.parametrize("options", [
    {"temperature": 1e-45, "top_k": 40},
    {"repetition_penalty": 1e-45, "top_k": 40},
    {"repetition_penalty": 1e-45},
    {"presence_penalty": 3e38, "frequency_penalty": -3e38, "top_p": 0.9},
    {"temperature": 3e38, "top_k": 40},
])
def test_extreme_finite_values_sample_without_error(make_seq, options):
    seq = make_seq(max_tokens=8, seed=3, **options)
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 30
    for _ in range(6):
        (result,) = sampler.sample(logits, [seq])
        assert result.error is None and 0 <= result.token < 50
        seq.append(result.token, None)


def test_tiny_temperature_acts_as_greedy(make_seq):
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(2))
    seq = make_seq(max_tokens=4, temperature=1e-45, top_k=40, seed=1)
    assert sampler.sample(logits, [seq])[0].token == int(logits.argmax())


def test_every_token_masked_fails_that_row_only(make_seq):
    vocab = 6
    masked = make_seq("m", max_tokens=4, bad_words=tuple((t,) for t in range(vocab)), top_k=3, seed=1)
    fine = make_seq("f", max_tokens=4)
    results = sampler.sample(torch.zeros(2, vocab), [masked, fine])
    assert results[0].error is not None and "masked" in results[0].error
    assert results[1].error is None


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty", "presence_penalty",
                                   "frequency_penalty", "length_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequestError, match=f"{field} must be a finite number"):
        SamplingParams(max_tokens=4, **{field: value})
