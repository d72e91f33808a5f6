"""LLMEngine in-process on the tiny random checkpoint (float32): greedy parity with HF transformers under
in-flight batching, chunked prefill and small KV blocks; stopping, abort, admission checks."""
from __future__ import annotations

import pytest
import torch

from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import FinishReason, Request
from backend.errors import InvalidRequestError

LENGTHS = [1, 9, 33, 70]  # prompt lengths: a single token, under, over and across many KV blocks
MAX_TOKENS = [12, 7, 10, 5]  # different, so sequences leave the batch at different steps
LATE = (17, 9)  # a prompt of 17 tokens, 9 to generate, added while the others are mid-generation


def greedy_requests(prompts, max_tokens, prefix="r", **sampling) -> list[Request]:
    return [Request(f"{prefix}{i}", p, SamplingParams(max_tokens=n, **sampling))
            for i, (p, n) in enumerate(zip(prompts, max_tokens))]


@pytest.mark.parametrize("limits", [
    {},
    {"max_num_tokens": 8},  # every prompt over 8 tokens is prefilled in chunks beside the decodes
    {"tokens_per_block": 2},  # up to 40 blocks a sequence
    {"max_num_tokens": 6, "tokens_per_block": 3, "max_batch_size": 2},  # also a queue: 2 sequences at a time
    {"enable_kv_cache_reuse": True, "tokens_per_block": 4},  # prefix caching on (nothing shared here)
    # max_utilization with a KV pool too small for all at once: sequences are preempted and recomputed.
    {"policy": "max_utilization", "max_tokens_in_paged_kv_cache": 160, "tokens_per_block": 4},
], ids=["default", "chunked-prefill", "small-blocks", "chunked-small-blocks-queued", "prefix-cache", "max-utilization"])
def test_greedy_matches_hf_under_in_flight_batching(limits, make_engine, prompts, hf_greedy, kv_idle):
    engine = make_engine(**limits)
    ps = prompts(LENGTHS + [LATE[0]], engine.vocab_size)
    requests = greedy_requests(ps[:-1], MAX_TOKENS)
    late = Request("late", ps[-1], SamplingParams(max_tokens=LATE[1]))
    got: dict[str, list[int]] = {r.request_id: [] for r in requests + [late]}
    for r in requests:
        engine.add_request(r)
    for step in range(200):
        if step == 3:
            engine.add_request(late)
        for out in engine.step():
            got[out.request_id].extend(out.new_token_ids)
        if step >= 3 and not engine.has_work():
            break
    for r in requests + [late]:
        assert got[r.request_id] == hf_greedy(r.prompt_ids, r.sampling.max_tokens), r.request_id
    kv_idle(engine.blocks)


def test_generate_matches_step_by_step(make_engine, prompts, hf_greedy):
    engine = make_engine()
    requests = greedy_requests(prompts([5, 20], engine.vocab_size, seed=1), [6, 4])
    assert engine.generate(requests) == {r.request_id: hf_greedy(r.prompt_ids, r.sampling.max_tokens)
                                         for r in requests}


def test_end_id_stops_and_is_not_output(make_engine, prompts, run_engine, kv_idle):
    engine = make_engine()
    (prompt,) = prompts([12], engine.vocab_size, seed=2)
    free = engine.generate([Request("free", prompt, SamplingParams(max_tokens=10))])["free"]
    end_id = free[4]
    outs = run_engine(engine, [Request("stop", prompt, SamplingParams(max_tokens=10, end_id=end_id))])["stop"]
    assert [t for o in outs for t in o.new_token_ids] == free[: free.index(end_id)]
    assert outs[-1].finished and outs[-1].finish_reason is FinishReason.END_ID
    assert outs[-1].new_token_ids == [] and outs[-1].num_output_tokens == free.index(end_id)
    assert not any(o.finished for o in outs[:-1])
    kv_idle(engine.blocks)


def test_stop_word_ends_output_before_it(make_engine, prompts, run_engine):
    engine = make_engine()
    (prompt,) = prompts([12], engine.vocab_size, seed=3)
    free = engine.generate([Request("free", prompt, SamplingParams(max_tokens=10))])["free"]
    word = tuple(free[3:5])
    start = next(i for i in range(len(free) - 1) if tuple(free[i : i + 2]) == word)
    outs = run_engine(engine, [Request("stop", prompt, SamplingParams(max_tokens=10, stop_words=(word,)))])["stop"]
    assert [t for o in outs for t in o.new_token_ids] == free[:start]
    assert outs[-1].finish_reason is FinishReason.STOP_WORD


def test_a_possible_stop_word_start_is_held_back_until_resolved(make_engine, prompts, run_engine):
    engine = make_engine()
    (prompt,) = prompts([12], engine.vocab_size, seed=3)
    free = engine.generate([Request("free", prompt, SamplingParams(max_tokens=10))])["free"]
    never = (free[2], engine.vocab_size - 1, engine.vocab_size - 2)  # starts like the output, never completes
    outs = run_engine(engine, [Request("s", prompt, SamplingParams(max_tokens=10, stop_words=(never,)))])["s"]
    assert [t for o in outs for t in o.new_token_ids] == free  # nothing lost once it is clear it is no stop word
    assert outs[2].new_token_ids == [] and outs[3].new_token_ids == free[2:4]  # free[2] waited for free[3]


def test_seeded_sampling_does_not_depend_on_the_batch(make_engine, prompts):
    engine = make_engine(max_num_tokens=8)
    ps = prompts([10, 25, 3], engine.vocab_size, seed=4)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, top_k=50, seed=123)
    alone = engine.generate([Request("s", ps[0], sampled)])["s"]
    crowd = [Request("s", ps[0], sampled)] + greedy_requests(ps[1:], [8, 15], prefix="g", top_k=20, seed=9)
    assert engine.generate(crowd)["s"] == alone


def test_log_probs_accumulate(make_engine, prompts, run_engine):
    engine = make_engine()
    (prompt,) = prompts([6], engine.vocab_size, seed=5)
    outs = run_engine(engine, [Request("lp", prompt, SamplingParams(max_tokens=5, return_log_probs=True))])["lp"]
    log_probs = [lp for o in outs for lp in o.new_log_probs]
    assert len(log_probs) == 5 and all(lp <= 0.0 for lp in log_probs)
    assert outs[-1].cum_log_prob == pytest.approx(sum(log_probs))


def test_abort_mid_generation_frees_the_kv_blocks(make_engine, prompts, kv_idle):
    engine = make_engine(tokens_per_block=4)
    (prompt,) = prompts([30], engine.vocab_size, seed=6)
    engine.add_request(Request("a", prompt, SamplingParams(max_tokens=50)))
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_used_blocks == 8 and engine.blocks.num_unreserved_free_blocks < engine.blocks.num_blocks
    out = engine.abort("a")
    assert out.finished and out.finish_reason is FinishReason.CANCELLED and out.num_output_tokens == 3
    assert not engine.has_work() and engine.abort("a") is None
    kv_idle(engine.blocks)


def test_abort_of_a_waiting_request_leaves_the_others_running(make_engine, prompts, kv_idle, hf_greedy):
    engine = make_engine(max_batch_size=1)
    ps = prompts([8, 8], engine.vocab_size, seed=7)
    engine.add_request(Request("running", ps[0], SamplingParams(max_tokens=6)))
    engine.add_request(Request("waiting", ps[1], SamplingParams(max_tokens=6)))
    first = engine.step()
    assert [o.request_id for o in first] == ["running"]
    assert engine.abort("waiting").finish_reason is FinishReason.CANCELLED
    got = first[0].new_token_ids + [t for _ in range(10) for o in engine.step() for t in o.new_token_ids]
    assert got == hf_greedy(ps[0], 6)
    kv_idle(engine.blocks)


@pytest.mark.parametrize("prompt_len, max_tokens, extra, message", [
    (0, 4, {}, "the prompt is empty"),
    (97, 4, {}, r"the prompt has 97 tokens, more than max_input_len \(96\)"),
    (4, 160, {}, r"max_tokens \(160\) exceeds max_output_len \(159\)"),
    (90, 100, {}, r"prompt \(90 tokens\) \+ max_tokens \(100\) exceeds max_seq_len \(160\)"),
    (4, 4, {"end_id": 8192}, r"end_id \[8192\] are outside the vocabulary \[0, 8192\)"),
    (4, 4, {"stop_words": ((5, -1),)}, r"stop word ids \[-1\] are outside the vocabulary"),
    (4, 4, {"bad_words": ((10**6,),)}, r"bad word ids \[1000000\] are outside the vocabulary"),
])
def test_validate_refuses_and_names_the_limit(make_engine, prompt_len, max_tokens, extra, message):
    engine = make_engine()  # max_input_len 96, max_seq_len 160
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request(Request("bad", tuple(range(1, prompt_len + 1)), SamplingParams(max_tokens, **extra)))
    assert not engine.has_work()


@pytest.mark.parametrize("token", [8192, -1])
def test_validate_refuses_token_ids_outside_the_vocabulary(make_engine, token):
    message = rf"input token ids \[{token}\] are outside the vocabulary \[0, 8192\)"
    with pytest.raises(InvalidRequestError, match=message):
        make_engine().validate(Request("bad", (1, token, 2), SamplingParams(max_tokens=4)))


def test_validate_refuses_a_request_id_in_flight(make_engine):
    engine = make_engine()
    engine.add_request(Request("dup", (1, 2), SamplingParams(max_tokens=4)))
    with pytest.raises(InvalidRequestError, match="'dup' is already in flight"):
        engine.add_request(Request("dup", (3, 4), SamplingParams(max_tokens=4)))


def test_max_seq_len_beyond_the_model_is_refused(make_engine):
    with pytest.raises(ValueError, match=r"exceeds the model's max_position_embeddings \(2048\)"):
        make_engine(max_seq_len=4096, max_input_len=64)


def test_kv_plan_takes_the_smallest_limit(tiny_ckpt_dir):
    from backend.engine.config import EngineConfig
    from backend.engine.memory_plan import plan_kv_cache
    from backend.model.config import kv_bytes_per_token, load_model_config

    model = load_model_config(tiny_ckpt_dir)
    per_token = kv_bytes_per_token(model)  # 2 x layers x kv heads x head dim x 4 bytes
    assert per_token == 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_size * 4
    engine = EngineConfig(max_batch_size=2, max_input_len=32, max_seq_len=64, max_num_tokens=64, tokens_per_block=8)
    plenty = plan_kv_cache(model, engine, free_bytes=2**34)
    assert (plenty.tokens, plenty.blocks) == (128, 16) and "max_batch_size" in plenty.reason
    tight = plan_kv_cache(model, engine, free_bytes=int(100 * per_token / 0.9) + 1)
    assert tight.tokens == 96 and "fraction" in tight.reason  # 100 tokens fit: 12 whole blocks of 8
    with pytest.raises(ValueError, match="less than one max_seq_len"):
        plan_kv_cache(model, engine, free_bytes=10 * per_token)


def test_thread_count_changes_between_steps_keep_greedy_equal_to_hf(make_engine, prompts, hf_greedy):
    """The governor (backend/engine/thread_governor.py) probes 1 thread among steps at 2: tokens stay HF's."""
    previous = torch.get_num_threads()
    try:
        engine = make_engine(num_threads=2)
        applied = []
        engine.governor.set_threads = lambda n: (applied.append(n), torch.set_num_threads(n))
        requests = greedy_requests(prompts([7, 7], engine.vocab_size, seed=2), [40, 40])
        assert engine.generate(requests) == {r.request_id: hf_greedy(r.prompt_ids, r.sampling.max_tokens)
                                             for r in requests}
        assert 1 in applied and 2 in applied, applied  # a probe ran
        assert make_engine(num_threads=2, adaptive_threads=False).governor is None
    finally:
        torch.set_num_threads(previous)
