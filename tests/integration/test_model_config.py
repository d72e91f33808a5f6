"""A config.pbtxt parameter that no model reads fails that model's load in the real tritonserver, naming it: here
tensorrtllm_backend's postprocessing `skip_special_tokens` (this one always skips them), which was silently
ignored before."""
from __future__ import annotations

import shutil

import pytest

from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports

UNREAD = 'parameters { key: "skip_special_tokens" value: { string_value: "false" } }\n'


def test_a_parameter_nothing_reads_fails_the_load_naming_it(demo, tmp_path):
    full = render(RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir), tmp_path / "full")
    repo = tmp_path / "repo"
    shutil.copytree(full / "postprocessing", repo / "postprocessing")
    config = repo / "postprocessing" / "config.pbtxt"
    config.write_text(config.read_text() + UNREAD)
    http, grpc, metrics = _free_ports(3)
    log = tmp_path / "tritonserver.log"
    with pytest.raises(RuntimeError):
        TritonServer(ServerOptions(repo, http, grpc, metrics), log_path=log).start(ready_timeout_s=120,
                                                                                 models=("postprocessing",))
    text = log.read_text(errors="replace")
    assert "postprocessing: config.pbtxt parameter(s) skip_special_tokens='false' not supported" in text, text[-3000:]
    # Unset, the same repository loads: the refusal is that parameter's.
    config.write_text(config.read_text().replace(UNREAD, 'parameters { key: "skip_special_tokens" value: '
                                                         '{ string_value: "${skip_special_tokens}" } }\n'))
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(ServerOptions(repo, http, grpc, metrics), log_path=tmp_path / "ok.log")
    server.start(ready_timeout_s=120, models=("postprocessing",))
    server.stop()
