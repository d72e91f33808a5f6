"""A checkpoint whose vocabulary is padded past its tokenizer's ids (Qwen2: 151,936 rows for 151,665 ids; Phi-3:
32,064 for 32,011), served by the real tritonserver: the model generates padded ids, which the direct model returns
as they are and the ensemble streams as no text (HF's decode drops them), the stream carrying on to its end.

The checkpoint: a tiny random Llama whose 64 padded rows are twins of the tokens it generates for the prompt, each
LM head row doubled (the greedy winner's logit is the largest of 8,192 and positive, so its twin's is larger) and
its embedding the same: generation follows the unpadded model's, with every such token replaced by its twin."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from build_engines.random_model import RANDOM_INIT_STD, TINY_DIMS, new_model, save_model
from build_engines.tokenizer import build_tokenizer
from ensembles import artifacts
from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration import anchor_calls as anchor
from tests.integration.conftest import ALL_MODELS, _free_ports, stopped_cleanly
from tests.integration.trtllm_direct import generate_ids

PAD, NEW_TOKENS = 64, 24
PROMPT = "def parse(text):\n    return "


def _greedy(model, prompt_ids: list[int], eos: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)[0, len(prompt_ids):].tolist()
    return out[: out.index(eos)] if eos in out else out


def _padded_checkpoint(out_dir, tokenizer_dir) -> tuple[list[int], int]:
    """(prompt ids, the tokenizer's id count); writes the padded checkpoint to out_dir."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = new_model(TINY_DIMS, tokenizer_dir, seed=0, initializer_range=RANDOM_INIT_STD)
    known, eos = model.config.vocab_size, tok.eos_token_id
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    twins = list(dict.fromkeys(_greedy(model, prompt_ids, eos)))[:PAD]
    model.resize_token_embeddings(known + PAD, mean_resizing=False)
    with torch.no_grad():
        for i, token in enumerate(twins):
            model.lm_head.weight[known + i] = 2 * model.lm_head.weight[token]
            model.model.embed_tokens.weight[known + i] = model.model.embed_tokens.weight[token]
    save_model(model, tokenizer_dir, out_dir)
    return prompt_ids, known


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    hf_dir = root / "hf"
    prompt_ids, known = _padded_checkpoint(hf_dir, build_tokenizer())
    served = artifacts.from_hf(hf_dir)
    spec = RepoSpec(engine_dir=served.engine_dir, tokenizer_dir=hf_dir, max_batch_size=4, max_input_len=64,
                    max_seq_len=128, max_num_tokens=128, engine_threads=1)
    http, grpc, metrics = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, root / "model_repository"), http, grpc, metrics),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=ALL_MODELS)
    try:
        yield srv, hf_dir, prompt_ids, known
    finally:
        srv.stop()
    stopped_cleanly(root / "tritonserver.log")


def test_padded_ids_stream_as_no_text_and_the_stream_goes_on(padded):
    srv, hf_dir, prompt_ids, known = padded
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    want = _greedy(hf, prompt_ids, tok.eos_token_id)
    assert any(t >= known for t in want) and len(want) == NEW_TOKENS  # the checkpoint does what it is for

    responses = generate_ids(srv.grpc_url, prompt_ids, NEW_TOKENS, streaming=True, end_id=tok.eos_token_id)
    assert [t for ids in responses for t in ids] == want  # the direct model: the ids themselves, padded ones too

    body = {"text_input": np.array([[PROMPT]], dtype=object), "max_tokens": np.array([[NEW_TOKENS]], dtype=np.int32),
            "stream": np.array([[True]])}
    streamed = anchor.grpc_stream(srv.grpc_url, "ensemble", body)
    assert len(streamed) >= 2
    assert "".join(anchor.text_of(r) for r in streamed) == tok.decode(want)  # padded ids: no text
    body["stream"] = np.array([[False]])  # one response, over the same decoupled ensemble
    assert [anchor.text_of(r) for r in anchor.grpc_stream(srv.grpc_url, "ensemble", body)] == [tok.decode(want)]
