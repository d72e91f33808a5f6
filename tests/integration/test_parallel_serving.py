"""TP=2 and PP=2 shardings of the demo model served by the real tritonserver (the tensorrt_llm model's engine is
rank 0; the other ranks are worker processes it starts): greedy output identical to HF transformers float32,
through tensorrt_llm directly and through the ensemble; no worker process is left once the server stops."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from build_engines.shard import shard_checkpoint
from client import GenerationRequest, GrpcLLMClient
from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports
from tests.integration.oracle import hf_greedy, hf_text
from tests.integration.trtllm_direct import generate_ids

# Parameters (tp, pp) whose server had a worker killed on purpose: its log then holds the engine loop's traceback.
_KILLED: set[tuple[int, int]] = set()
CASES = [("def ", 24), ("import os\n", 40), ("class Foo(object):\n    def __init__(self", 32)]


def _worker_pids(ckpt_dir: Path) -> list[int]:
    """Processes whose command line is a parallel worker of this checkpoint."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"backend.model.parallel.worker" in cmd and str(ckpt_dir).encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["tp2", "pp2"])
def sharded_server(request, demo, tmp_path_factory):
    tp, pp = request.param
    root = tmp_path_factory.mktemp(f"tp{tp}pp{pp}")
    ckpt = shard_checkpoint(demo.engine_dir, root / "ckpt", tp, pp)
    spec = RepoSpec(engine_dir=ckpt, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8, max_input_len=256,
                    max_seq_len=512, max_num_tokens=256, cancellation_check_period_ms=20)
    repo = render(spec, root / "model_repository")
    http, grpc, metrics = _free_ports(3)
    srv = TritonServer(ServerOptions(repo, http, grpc, metrics), log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm", "preprocessing", "postprocessing"))
    try:
        workers = _worker_pids(ckpt)
        assert len(workers) == tp * pp - 1, "rank 0 runs in the tensorrt_llm model, every other rank in a worker"
        srv.parallel = (request.param, ckpt)  # for the crash test
        yield srv
    finally:
        srv.stop()
    deadline = time.monotonic() + 30
    while _worker_pids(ckpt) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _worker_pids(ckpt) == [], "parallel workers outlived the server"
    log = (root / "tritonserver.log").read_text(errors="replace")
    assert "Segmentation fault" not in log, log[-4000:]
    assert request.param in _KILLED or "Traceback" not in log, log[-4000:]


@pytest.mark.parametrize("prompt,max_tokens", CASES)
def test_sharded_ids_match_hf(sharded_server, hf, prompt, max_tokens):
    prompt_ids, expected = hf_greedy(hf, prompt, max_tokens)
    for streaming in (False, True):
        chunks = generate_ids(sharded_server.grpc_url, prompt_ids, max_tokens, streaming, end_id=hf[1].eos_token_id)
        assert [t for c in chunks for t in c] == expected


def test_sharded_ensemble_concurrent_requests_match_hf(sharded_server, hf):
    """Several requests in flight at once: the ranks run batched steps mixing prefill and decode."""
    from concurrent.futures import ThreadPoolExecutor

    grpc = GrpcLLMClient(sharded_server.grpc_url)

    def text(case):
        req = GenerationRequest(prompt=case[0], max_tokens=case[1], stream=False)
        return "".join(c.text for c in grpc.generate(req))

    with ThreadPoolExecutor(len(CASES)) as pool:
        got = list(pool.map(text, CASES))
    assert got == [hf_text(hf, p, n) for p, n in CASES]


def test_killed_worker_fails_requests_clearly(sharded_server, hf):
    """Last in this module (it breaks the server's engine): a worker killed between requests makes every
    later request fail at once with an error naming the dead rank, never hang."""
    import os
    import signal

    import tritonclient.utils

    param, ckpt = sharded_server.parallel
    _KILLED.add(param)
    os.kill(_worker_pids(ckpt)[0], signal.SIGKILL)
    prompt_ids, _ = hf_greedy(hf, "def ", 8)
    for _ in range(2):
        with pytest.raises(tritonclient.utils.InferenceServerException,
                           match=r"parallel engine is down .*rank 1 \(pid \d+\) exited -9"):
            generate_ids(sharded_server.grpc_url, prompt_ids, 8, False, end_id=hf[1].eos_token_id)
