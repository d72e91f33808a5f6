"""The sampling controls through the real server, each against HF transformers (float32) as the oracle:
repetition penalty, min_tokens, bad_words (single tokens and sequences), presence / frequency penalties; and the
max_utilization policy preempting under KV pressure with every request still exact."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration import metrics
from tests.integration.conftest import _free_ports
from tests.integration.oracle import hf_greedy
from tests.integration.trtllm_direct import generate_ids

PROMPT = "def __init__(self, name, value):\n    "


def _hf(hf, prompt_ids: list[int], max_new_tokens: int, eos_id: int, **kwargs) -> list[int]:
    """HF greedy with generation controls; like our engine, generation stops at (and drops) eos_id."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = hf[0].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id, **kwargs)
    tokens = out[0, len(prompt_ids):].tolist()
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def _ours(server, prompt_ids: list[int], max_tokens: int, end_id: int, **extra) -> list[int]:
    (ids,) = generate_ids(server.grpc_url, prompt_ids, max_tokens, False, end_id, **extra)
    return ids


def _word_list(words: list[list[int]]) -> np.ndarray:
    """The anchor's [1, 2, L] word list: row 0 the flattened ids, row 1 the end offsets padded with -1."""
    flat = [t for w in words for t in w]
    offsets = np.cumsum([len(w) for w in words]).tolist()
    width = max(len(flat), len(offsets))
    return np.array([[flat + [0] * (width - len(flat)), offsets + [-1] * (width - len(offsets))]], dtype=np.int32)


def test_repetition_penalty_matches_hf(server, hf):
    prompt_ids, plain = hf_greedy(hf, PROMPT, 32)
    eos = hf[1].eos_token_id
    expected = _hf(hf, prompt_ids, 32, eos, repetition_penalty=1.3)
    assert expected != plain  # the penalty changes the greedy path on this prompt, so the test tells
    got = _ours(server, prompt_ids, 32, eos, repetition_penalty=np.array([[1.3]], dtype=np.float32))
    assert got == expected


def test_min_tokens_holds_back_end_id_as_hf_min_new_tokens(server, hf):
    prompt_ids, plain = hf_greedy(hf, PROMPT, 24)
    end_id = plain[2]  # greedy reaches this token at step 3: with it as end_id, generation ends there
    assert _ours(server, prompt_ids, 24, end_id) == plain[:2]
    expected = _hf(hf, prompt_ids, 24, end_id, min_new_tokens=12)
    assert len(expected) >= 12
    got = _ours(server, prompt_ids, 24, end_id, min_tokens=np.array([[12]], dtype=np.int32))
    assert got == expected


def test_bad_words_match_hf_bad_words_ids(server, hf):
    prompt_ids, plain = hf_greedy(hf, PROMPT, 24)
    eos = hf[1].eos_token_id
    words = [[plain[0]], [plain[3], plain[4]]]  # a single token, and a two-token sequence the greedy path takes
    expected = _hf(hf, prompt_ids, 24, eos, bad_words_ids=words)
    assert expected[0] != plain[0]
    got = _ours(server, prompt_ids, 24, eos, bad_words_list=_word_list(words))
    assert got == expected
    for a, b in zip(got, got[1:]):
        assert [a, b] != words[1]


class _PresenceFrequency(LogitsProcessor):
    """OpenAI / vLLM semantics over generated tokens only: logit -= presence * [count > 0] + frequency * count."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[0, self.prompt_len:]
        counts = torch.bincount(generated, minlength=scores.shape[-1]).to(scores.dtype)
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


@pytest.mark.parametrize("presence, frequency", [(1.5, 0.0), (0.0, 0.7), (0.5, 0.5)])
def test_presence_and_frequency_penalties(server, hf, presence, frequency):
    prompt_ids, _ = hf_greedy(hf, PROMPT, 32)
    eos = hf[1].eos_token_id
    processor = LogitsProcessorList([_PresenceFrequency(len(prompt_ids), presence, frequency)])
    expected = _hf(hf, prompt_ids, 32, eos, logits_processor=processor)
    got = _ours(server, prompt_ids, 32, eos, presence_penalty=np.array([[presence]], dtype=np.float32),
                frequency_penalty=np.array([[frequency]], dtype=np.float32))
    assert got == expected


@pytest.fixture(scope="module")
def tight_server(demo, tmp_path_factory):
    """max_utilization with a KV cache of 12 blocks x 32 tokens: eight 100-token requests cannot all stay resident."""
    root = tmp_path_factory.mktemp("triton-maxutil")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=128, max_seq_len=256, max_num_tokens=256, max_tokens_in_paged_kv_cache=12 * 32,
                    batch_scheduler_policy="max_utilization", enable_kv_cache_reuse=False)
    http, grpc, port = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, root / "repo", models=("tensorrt_llm",)), http, grpc, port), log_path=root / "server.log")
    srv.start(ready_timeout_s=300, models=("tensorrt_llm",))
    yield srv
    srv.stop()


def test_max_utilization_preempts_and_loses_nothing(tight_server, hf):
    prompts = [f"def handler_{i}(request):\n    " for i in range(8)]
    eos = hf[1].eos_token_id
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        ids = hf[1].encode(prompts[i], add_special_tokens=False)
        results[i] = _ours(tight_server, ids, 64 + 8 * i, eos)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i, prompt in enumerate(prompts):
        assert results.get(i) == hf_greedy(hf, prompt, 64 + 8 * i)[1], i
    paused = metrics.wait_until(tight_server.opts.metrics_port, "nv_trt_llm_inflight_batcher_metrics",
                                lambda v: v > 0, inflight_batcher_specific_metric="paused_requests")
    assert paused and paused > 0  # the tight cache did force preemptions, which recomputed exactly
