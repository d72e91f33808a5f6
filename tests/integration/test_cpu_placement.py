"""engine_cpus through `python -m ensembles serve` and the real tritonserver (backend/serving/cpu_placement.py):
the engine's step thread runs alone on its CPU, tritonserver and every other thread on the rest, and what it serves
is still HF's greedy text, streamed and not."""
from __future__ import annotations

import os

import pytest

from ensembles.render import RepoSpec, render
from tests.integration.launcher import Launcher
from tests.integration.oracle import hf_text
from tests.integration.tenant_client import generate

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
PROMPT, MAX_TOKENS = "def parse_header(line):\n", 24


@pytest.fixture(scope="module")
def launcher(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu-placement")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=4,
                    max_input_len=256, max_seq_len=512, engine_threads=1, engine_cpus="auto")
    started = Launcher(render(spec, root / "model_repository"), root / "launcher.log")
    try:
        yield started.start()
    finally:
        started.teardown()


def test_the_engine_thread_runs_alone_on_its_cpu(launcher):
    usable = os.sched_getaffinity(0)
    engine, rest = {max(usable)}, usable - {max(usable)}
    assert generate(launcher.grpc_url, PROMPT, 4).ok  # the engine thread has stepped
    server = launcher.server()
    assert set(server.cpu_affinity()) == rest
    for stub in launcher.stubs():
        placed = [os.sched_getaffinity(t.id) for t in stub.threads()]
        if "/tensorrt_llm/1/model.py" in " ".join(stub.cmdline()):
            assert placed.count(engine) == 1, placed  # the step thread (one torch thread: no OpenMP workers)
            assert os.sched_getaffinity(stub.pid) == rest  # the stub's main thread, which Triton calls
            assert all(cpus in (engine, rest) for cpus in placed), placed
        else:
            assert all(cpus == rest for cpus in placed), (stub.cmdline(), placed)


@pytest.mark.parametrize("stream", [False, True])
def test_it_serves_hf_greedy_text(launcher, hf, stream):
    out = generate(launcher.grpc_url, PROMPT, MAX_TOKENS, stream=stream)
    assert out.ok, out.error
    assert "".join(out.texts) == hf_text(hf, PROMPT, MAX_TOKENS)
