"""Greedy generation through the real tritonserver equals HF transformers, token for token, on every path:
tensorrt_llm directly (ids), the ensemble over gRPC (streamed and not) and over HTTP generate/generate_stream."""
from __future__ import annotations

import threading

import pytest

from client import GenerationRequest, GrpcLLMClient, HttpLLMClient
from tests.integration.oracle import hf_greedy, hf_text
from tests.integration.trtllm_direct import generate_ids

LONG_PROMPT = (
    "import os\nimport sys\n\n\ndef walk(top, topdown=True, onerror=None, followlinks=False):\n"
    '    """Directory tree generator.\n\n    For each directory in the directory tree rooted at top (including top\n'
    "    itself, but excluding '.' and '..'), yields a 3-tuple\n\n        dirpath, dirnames, filenames\n"
    '    """\n    sys.audit("os.walk", top, topdown, onerror, followlinks)\n    stack = [fspath(top)]\n'
    "    islink, join = path.islink, path.join\n    while stack:\n        top = stack.pop()\n"
)
CASES = [
    ("def ", 24),
    ("import os\n", 48),
    ("class Foo(object):\n    def __init__(self", 64),
    ("for i in range(10):\n", 8),
    ("# Copyright", 1),
    (LONG_PROMPT, 96),
]


@pytest.mark.parametrize("prompt,max_tokens", CASES)
@pytest.mark.parametrize("streaming", [False, True])
def test_tensorrt_llm_ids_match_hf(server, hf, prompt, max_tokens, streaming):
    prompt_ids, expected = hf_greedy(hf, prompt, max_tokens)
    chunks = generate_ids(server.grpc_url, prompt_ids, max_tokens, streaming, end_id=hf[1].eos_token_id)
    assert [t for c in chunks for t in c] == expected
    if streaming and len(expected) > 1:
        # Streamed as generated: the first token alone, then one per response, or a few merged while this
        # stream's previous response is still queued in the server (RowStream), never all at the end.
        sent = [c for c in chunks if c]
        assert len(sent[0]) == 1 and len(sent) >= 2, "streaming must deliver tokens as they come"


@pytest.mark.parametrize("prompt,max_tokens", CASES)
def test_ensemble_text_matches_hf_on_every_path(server, hf, prompt, max_tokens):
    expected = hf_text(hf, prompt, max_tokens)
    grpc = GrpcLLMClient(server.grpc_url)
    http = HttpLLMClient(f"http://{server.http_url}")
    whole = GenerationRequest(prompt=prompt, max_tokens=max_tokens, stream=False)
    streamed = GenerationRequest(prompt=prompt, max_tokens=max_tokens, stream=True)
    assert "".join(c.text for c in grpc.generate(whole)) == expected
    assert "".join(c.text for c in grpc.generate(streamed)) == expected
    assert http.generate(whole) == expected
    assert "".join(c.text for c in http.generate_stream(streamed)) == expected


def test_prompt_is_echoed_when_input_not_excluded_and_not_streamed(server, hf):
    # As the anchor: a non-streamed output starts with the prompt; a streamed one never holds it (its clients
    # prepend the prompt themselves). Multi-byte characters in the prompt: streamed chunks must not split them.
    prompt = "# café → 日本語 ✓\ndef "
    generated = hf_text(hf, prompt, 20)
    grpc = GrpcLLMClient(server.grpc_url)
    for stream, expected in ((False, prompt + generated), (True, generated)):
        req = GenerationRequest(prompt=prompt, max_tokens=20, stream=stream, exclude_input_in_output=False)
        assert "".join(c.text for c in grpc.generate(req)) == expected


def test_concurrent_streams_are_all_correct(server, hf):
    """20 streams in flight at once, each with its own prompt and length: every one equals HF greedy."""
    prompts = [f"def function_{i}(x, y):\n    " if i % 2 else f"import module_{i}\n" for i in range(20)]
    lengths = [16 + 3 * i for i in range(20)]
    expected = [hf_text(hf, p, n) for p, n in zip(prompts, lengths)]
    got: list[str | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            req = GenerationRequest(prompt=prompts[i], max_tokens=lengths[i], stream=True)
            got[i] = "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(req))
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert got == expected


def test_log_probs_and_token_counts(server, hf):
    prompt_ids, expected = hf_greedy(hf, "import os\n", 12)
    req = GenerationRequest(prompt="import os\n", max_tokens=12, return_log_probs=True,
                            return_num_input_tokens=True, return_num_output_tokens=True)
    (chunk,) = list(GrpcLLMClient(server.grpc_url).generate(req))
    assert chunk.num_input_tokens == len(prompt_ids)
    assert chunk.num_output_tokens == len(expected)
    assert len(chunk.output_log_probs) == len(expected)
    assert chunk.cum_log_probs == pytest.approx(sum(chunk.output_log_probs), rel=1e-4)
    assert all(lp <= 0 for lp in chunk.output_log_probs)


def test_seeded_sampling_is_reproducible(server):
    grpc = GrpcLLMClient(server.grpc_url)

    def sample(seed: int) -> str:
        req = GenerationRequest(prompt="def ", max_tokens=32, top_k=50, top_p=0.95, temperature=1.0, seed=seed)
        return "".join(c.text for c in grpc.generate(req))

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(s) != first for s in (1, 2, 3))
