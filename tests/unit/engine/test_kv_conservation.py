"""KV blocks are never leaked, whatever the order of arrivals, aborts and endings: seeded random schedules of
requests sharing prompt prefixes (prefix caching on), aborted at random steps (waiting, prefilling in chunks,
decoding, preempted), in a pool small enough to preempt; once idle every block is back and unreferenced."""
from __future__ import annotations

import random

import pytest

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request

LIMITS = [
    {"enable_kv_cache_reuse": True, "tokens_per_block": 4, "max_num_tokens": 16},
    {"enable_kv_cache_reuse": True, "tokens_per_block": 4, "policy": "max_utilization",
     "max_tokens_in_paged_kv_cache": 160, "max_batch_size": 8},
]


def _schedule(rng: random.Random, vocab: int, n: int) -> list[tuple[int, Request, int | None]]:
    """(arrival step, request, abort step or None) for n requests whose prompts share a few prefixes."""
    prefixes = [tuple(rng.randrange(1, vocab) for _ in range(rng.choice([4, 8, 9, 13]))) for _ in range(3)]
    plan = []
    for i in range(n):
        prompt = rng.choice(prefixes) + tuple(rng.randrange(1, vocab) for _ in range(rng.randrange(1, 12)))
        arrival = rng.randrange(0, 30)
        abort = arrival + rng.randrange(0, 25) if rng.random() < 0.6 else None
        sampling = SamplingParams(max_tokens=rng.randrange(1, 60))
        plan.append((arrival, Request(f"r{i}", prompt, sampling), abort))
    return plan


@pytest.mark.parametrize("limits", LIMITS, ids=["chunked", "preempting"])
@pytest.mark.parametrize("seed", range(20))
def test_no_kv_block_is_leaked_by_any_order_of_aborts(make_engine, kv_idle, limits, seed):
    engine = make_engine(**limits)
    plan = _schedule(random.Random(seed), engine.vocab_size, 16)
    for step in range(400):
        for arrival, request, abort in plan:
            if arrival == step:
                engine.add_request(request)
            if abort == step:
                engine.abort(request.request_id)
        engine.step()
        if step > 60 and not engine.has_work():
            break
    assert not engine.has_work()
    kv_idle(engine.blocks)
    assert not any(engine.blocks._refs), "a block is still referenced"
