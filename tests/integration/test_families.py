"""Every family fixture served by the real tritonserver through the ensemble, greedy output equal to HF transformers
float32 token for token.

One server for the whole matrix: each fixture (build_engines/family_fixtures.py) is converted the way
`python -m ensembles serve --hf DIR` converts it (ensembles/artifacts.from_hf) and installed as a version of
tensorrt_llm in a canary repository; a request picks its version with the `model_version` parameter (the router
pins it). All fixtures share the demo tokenizer, which preprocessing / postprocessing load from its own directory
(transformers 5 picks a tokenizer class by the model_type of a config.json beside the tokenizer files: a Qwen2
one tokenizes the demo vocabulary differently, so the reference tokenizes with exactly what the server uses). Prompts are longer than the sliding windows (16; Phi-3 mini-4k
31), longer than or growing past longrope's original length (32) and dynamic NTK's max_position_embeddings (48).
"""
from __future__ import annotations

import functools
import uuid

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.formats.versions import install_version
from backend.policy.canary_router import RoutingTable
from build_engines.family_fixtures import FIXTURES, make_fixture
from build_engines.tokenizer import build_tokenizer
from ensembles import artifacts
from ensembles.canary_render import persist_versions, render_canary, routing_file
from ensembles.render import RepoSpec
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports
from tests.integration.trtllm_direct import generate_ids, tensor

# Every family, the rope variants the issue found wrong (llama3, linear) and the stateful ones (dynamic NTK, longrope),
# the sliding windows (all layers, alternating). The other fixtures (llama2, qwen2_swa, qwen2_yarn, phi3_partial,
# gemma2_capped) run in-process against HF in tests/unit/engine/test_families.py: a version costs server start-up.
NAMES = ["gemma2", "llama2_linear", "llama3", "llama_dynamic", "mistral", "phi3_128k", "phi3_4k", "qwen2", "qwen3"]
assert set(NAMES) <= set(FIXTURES)
VERSIONS = {name: i + 1 for i, name in enumerate(NAMES)}
NEW_TOKENS = 20
MAX_SEQ_LEN = 64  # phi3_4k's max_position_embeddings; the limits are the same for every version
ADMIN_KEY = "families-test-admin-key"
# Requests go one at a time; Triton stops a Python model's instances one after another, ~1.2 s each (the Python
# backend sleeps 1 s in each instance's health check at unload), so the default 16 would add ~17 s to the stop.
ROUTER_INSTANCES = 2


@pytest.fixture(scope="module")
def families_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    tokenizer_dir = build_tokenizer()
    served = {name: artifacts.from_hf(make_fixture(name, root / name, tokenizer_dir)) for name in NAMES}
    spec = RepoSpec(engine_dir=served[NAMES[0]].engine_dir, tokenizer_dir=tokenizer_dir, max_batch_size=4,
                    max_input_len=MAX_SEQ_LEN - NEW_TOKENS, max_seq_len=MAX_SEQ_LEN, max_num_tokens=16,
                    tokens_per_block=8, max_tokens_in_paged_kv_cache=256, engine_threads=1,
                    router_instance_count=ROUTER_INSTANCES)
    repo = render_canary(spec, root / "model_repository")
    for name in NAMES[1:]:
        install_version(repo, served[name].engine_dir, version=VERSIONS[name], meta={"family_fixture": name})
    persist_versions(repo, list(VERSIONS.values()))
    RoutingTable({v: 100 if v == 1 else 0 for v in VERSIONS.values()}, stable=1).write(routing_file(repo))
    srv = TritonServer(ServerOptions(repo, *_free_ports(3), model_control_mode="explicit", admin_key=ADMIN_KEY),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=600, models=("ensemble", "router", "tensorrt_llm"))
    try:
        yield srv, AutoTokenizer.from_pretrained(str(tokenizer_dir)), {name: served[name].tokenizer_dir
                                                                         for name in NAMES}
    finally:
        srv.stop()
    log = (root / "tritonserver.log").read_text(errors="replace")
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]


@functools.lru_cache(maxsize=None)
def _hf_greedy(hf_dir: str, prompt_ids: tuple[int, ...], eos_id: int) -> tuple[int, ...]:
    """HF generate() from a fresh float32 eager model (dynamic NTK keeps state across calls), stopping at eos as the
    engine does (the end id is not part of the output)."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                         max_new_tokens=NEW_TOKENS, eos_token_id=eos_id, pad_token_id=eos_id)
    tokens = out[0, len(prompt_ids):].tolist()
    return tuple(tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens)


def _prompts(tokenizer) -> list[str]:
    """Texts of 28 (grows past 32 while generating), 40 (past every window, past 32) and 12 tokens."""
    words = " ".join(f"value_{i} = compute(value_{i - 1}, {i})" for i in range(1, 40))
    ids = tokenizer.encode(words, add_special_tokens=False)
    return [tokenizer.decode(ids[:n]) for n in (28, 40, 12)]


def _ensemble_text(url: str, prompt: str, version: int) -> str:
    client = grpcclient.InferenceServerClient(url)
    results = []
    try:
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        inputs = {"text_input": np.array([[prompt.encode()]], dtype=object),
                  "max_tokens": np.array([[NEW_TOKENS]], dtype=np.int32)}
        client.async_stream_infer("ensemble", [tensor(k, v) for k, v in inputs.items()], request_id=uuid.uuid4().hex,
                                  parameters={"model_version": version}, enable_empty_final_response=True)
    finally:
        client.stop_stream()  # waits for the stream to finish
        client.close()
    texts = []
    for result, error in results:
        if error is not None:
            raise error
        served = result.as_numpy("served_version")
        assert served is None or int(served.reshape(-1)[0]) == version
        if result.as_numpy("text_output") is not None:
            texts.extend(t.decode() for t in result.as_numpy("text_output").reshape(-1))
    return "".join(texts)


@pytest.mark.parametrize("name", NAMES)
def test_family_served_greedy_equals_hf(families_server, name):
    """Token ids from tensorrt_llm (that version, streamed) and text through the ensemble, both HF's."""
    server, tok, hf_dirs = families_server
    for prompt in _prompts(tok):
        prompt_ids = tuple(tok.encode(prompt, add_special_tokens=False))
        want = _hf_greedy(str(hf_dirs[name]), prompt_ids, tok.eos_token_id)
        chunks = generate_ids(server.grpc_url, list(prompt_ids), NEW_TOKENS, True, end_id=tok.eos_token_id,
                              model_version=str(VERSIONS[name]))
        assert tuple(t for c in chunks for t in c) == want, (name, len(prompt_ids))
        text = _ensemble_text(server.grpc_url, prompt, VERSIONS[name])
        assert text == tok.decode(list(want), skip_special_tokens=True), (name, len(prompt_ids))
