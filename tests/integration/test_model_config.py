"""Parameters of our models' config.pbtxt in the real tritonserver: one that no model reads fails that model's load,
naming it (here tensorrtllm_backend's preprocessing `visual_model_path`: no multimodal models here), instead of being
ignored; the anchor's postprocessing `skip_special_tokens` is implemented (false spells special tokens out)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from transformers import AutoTokenizer

from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports
from tests.integration.trtllm_direct import stream_infer, tensor


def _parameter(name: str, value: str) -> str:
    return f'parameters {{ key: "{name}" value: {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def rendered(demo, tmp_path_factory):
    return render(RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir),
                  tmp_path_factory.mktemp("config") / "full")


def _copy_model(rendered, repo, model: str, name: str, extra: str) -> None:
    shutil.copytree(rendered / model, repo / name)
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{model}"', f'name: "{name}"') + extra)


def test_a_parameter_nothing_reads_fails_the_load_naming_it(rendered, tmp_path):
    repo = tmp_path / "repo"
    _copy_model(rendered, repo, "preprocessing", "preprocessing", _parameter("visual_model_path", "/models/vit"))
    log = tmp_path / "tritonserver.log"
    with pytest.raises(RuntimeError):
        TritonServer(ServerOptions(repo, *_free_ports(3)), log_path=log).start(ready_timeout_s=120,
                                                                             models=("preprocessing",))
    text = log.read_text(errors="replace")
    assert "preprocessing: config.pbtxt parameter(s) visual_model_path='/models/vit' not supported" in text, \
        text[-3000:]


def test_skip_special_tokens_false_spells_them_out(rendered, demo, tmp_path):
    """postprocessing called directly, as the anchor's end_to_end_test does: TOKENS_BATCH holding the end token."""
    tok = AutoTokenizer.from_pretrained(str(demo.tokenizer_dir))
    repo = tmp_path / "repo"
    _copy_model(rendered, repo, "postprocessing", "postprocessing", "")
    _copy_model(rendered, repo, "postprocessing", "postprocessing_keep", _parameter("skip_special_tokens", "false"))
    ids = tok.encode("def f(x):", add_special_tokens=False) + [tok.eos_token_id]
    inputs = [tensor("TOKENS_BATCH", np.array([[ids]], dtype=np.int32)),
              tensor("SEQUENCE_LENGTH", np.array([[len(ids)]], dtype=np.int32))]
    server = TritonServer(ServerOptions(repo, *_free_ports(3)), log_path=tmp_path / "tritonserver.log")
    server.start(ready_timeout_s=120, models=("postprocessing", "postprocessing_keep"))
    try:
        texts = {model: stream_infer(server.grpc_url, model, inputs)[-1].as_numpy("OUTPUT")[0].decode()
                 for model in ("postprocessing", "postprocessing_keep")}
    finally:
        server.stop()
    assert texts["postprocessing"] == tok.decode(ids, skip_special_tokens=True)
    assert texts["postprocessing_keep"] == tok.decode(ids, skip_special_tokens=False)
    assert texts["postprocessing_keep"].endswith(tok.eos_token) and tok.eos_token not in texts["postprocessing"]
