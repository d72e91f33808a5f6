"""A request that waits never holds back another, through the two models that call the LLM model from Python (BLS):
the canary router (ensemble -> router -> tensorrt_llm) and tensorrt_llm_bls (-> router -> tensorrt_llm).

A decoupled BLS exec() returns at the called model's first response, a unary one at its only response. When the
router and tensorrt_llm_bls made those calls under the lock that serializes their response sends, one request
waiting for a slot in a full engine stopped every other stream's tokens and the `stop` of a cancelled stream that
would have freed the slot (the waiting request then got a slot only when some stream ran to its end), and in unary
mode one long generation held back every request sent after it. Both now serve one request at a time per instance
(a BLS stream from several threads of one process can deadlock it: docs/canary.md, "Limits"): the waiting requests
hold instances or wait in Triton's queue, and the cancelled stream's `stop` goes straight to the tensorrt_llm version
that served it, never queued behind them.

Own servers: the canary repository with an engine of two slots (max_batch_size 2), decoupled and unary. The long
generations ask for min_tokens = max_tokens, so no model the recipe trains ends them early with its end token.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from ensembles.canary_render import render_canary
from ensembles.render import RepoSpec
from ensembles.server import ServerOptions, TritonServer
from tests.integration import anchor_calls as anchor
from tests.integration.conftest import _free_ports
from tests.integration.stub_deaths import StubDeaths

SLOTS = 2  # the engine's running batch: two long generations fill it
LONG = 1900  # tokens: several seconds at any rate measured here (perf/REPORT.md), far more than each check takes
# Tokens: a unary call returns only at its end, and it must still run 1 s after it was sent (1,000 took 1.6 s on a
# Zen 5 EPYC, ~600 tokens/s at batch 1): as many as max_seq_len leaves after the prompt.
UNARY_LONG = 1900
WAITING = 40  # requests waiting for a slot at once
MODELS = ("ensemble", "tensorrt_llm_bls")


@contextmanager
def _serving(demo, root, decoupled: bool, router_instances: int):
    """The canary repository with two engine slots, served; a dead model process fails the test at once."""
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=SLOTS,
                    max_input_len=64, max_seq_len=2048, max_num_tokens=256, decoupled_mode=decoupled,
                    router_instance_count=router_instances)
    srv = TritonServer(ServerOptions(render_canary(spec, root / "model_repository"), *_free_ports(3)),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "router", "tensorrt_llm", "tensorrt_llm_bls"))
    deaths = StubDeaths(srv.proc.pid)
    try:
        yield srv, deaths
    finally:
        deaths.close()
        srv.stop()
    log = (root / "tritonserver.log").read_text(errors="replace")
    assert not deaths.died, f"{deaths.died}; log: {log[-4000:]}"
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]


@pytest.fixture(scope="module")
def streaming(demo, tmp_path_factory):
    # the default 16 router instances: 14 of the 40 waiting requests are forwarded (they wait in the engine), 26 in
    # Triton's queue
    with _serving(demo, tmp_path_factory.mktemp("waiting-decoupled"), decoupled=True, router_instances=16) as served:
        yield served


@pytest.fixture(scope="module")
def unary(demo, tmp_path_factory):
    # two requests at once (a long and a short one); each router instance adds ~1.2 s to the server's stop
    with _serving(demo, tmp_path_factory.mktemp("waiting-unary"), decoupled=False, router_instances=2) as served:
        yield served


def _inputs(prompt: str, tokens: int, stream: bool) -> dict[str, np.ndarray]:
    return anchor.e2e_inputs(prompt, tokens, stream, min_tokens=np.array([[tokens]], dtype=np.int32))


class Generation:
    """One streamed request on a gRPC stream of its own: counts its tokens, notes its first and final response."""

    def __init__(self, url: str, model: str, prompt: str, tokens: int) -> None:
        self.tokens, self.closed = 0, False
        self.errors: list[str] = []
        self.first, self.final = threading.Event(), threading.Event()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._on_response)
        self.client.async_stream_infer(model, [anchor.tensor(grpcclient, k, v)
                                               for k, v in _inputs(prompt, tokens, True).items()],
                                       enable_empty_final_response=True)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.errors.append(str(error))
            self.final.set()
            return
        if result.as_numpy("text_output") is not None:
            self.tokens += 1
            self.first.set()
        if result.get_response().parameters["triton_final_response"].bool_param:
            self.final.set()

    def cancel(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.stop_stream(cancel_requests=True)
            self.client.close()


def _tokens_over(generations: list[Generation], seconds: float) -> list[int]:
    before = [g.tokens for g in generations]
    time.sleep(seconds)
    return [g.tokens - b for g, b in zip(generations, before)]


@pytest.mark.parametrize("model", MODELS)
def test_requests_waiting_for_a_slot_hold_back_no_stream(streaming, model):
    """WAITING requests wait for a slot: more than python_backend's pool (32 threads) could hold waiting calls."""
    srv, deaths = streaming
    cancelled = Generation(srv.grpc_url, model, "def cancelled(x):\n", LONG)
    running = Generation(srv.grpc_url, model, "def running(x):\n", LONG)
    waiting: list[Generation] = []
    try:
        for long in (cancelled, running):
            assert long.first.wait(120), long.errors
        waiting = [Generation(srv.grpc_url, model, f"def waiting_{i}(x):\n", 4) for i in range(WAITING)]
        time.sleep(1.0)  # they reach the router / tensorrt_llm_bls and wait: the engine's two slots are taken
        deaths.check()
        assert not any(w.first.is_set() for w in waiting), "the engine was expected full: the others should wait"
        # Short: `running` must still be generating once a waiting request was served (below), at any machine's speed.
        moved = _tokens_over([cancelled, running], 0.5)
        assert min(moved) >= 2, f"tokens of the two running streams while {WAITING} requests waited: {moved}"
        cancelled.cancel()  # its `stop` frees a slot for the waiting requests
        served = _first_to_finish(waiting, timeout_s=60)
        assert served.errors == [] and served.tokens >= 1, served.errors
        # Served in the slot the cancellation freed, not in one freed by a stream that ran to its end.
        assert not running.final.is_set() and running.tokens < LONG, (running.tokens, running.errors)
        for w in waiting:  # then all of them, one slot after another
            assert w.final.wait(120) and w.errors == [] and w.tokens >= 1, w.errors
        deaths.check()
    finally:
        for generation in (cancelled, running, *waiting):
            generation.cancel()


def _first_to_finish(generations: list[Generation], timeout_s: float) -> Generation:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for g in generations:
            if g.final.is_set():
                return g
        time.sleep(0.01)
    raise TimeoutError(f"none of {len(generations)} waiting requests finished in {timeout_s} s")


@pytest.mark.parametrize("model", MODELS)
def test_a_long_unary_generation_holds_back_no_request(unary, model):
    srv, deaths = unary
    done: dict[str, float] = {}

    def infer(name: str, prompt: str, tokens: int) -> str:
        result = anchor.infer(srv.grpc_url, model, _inputs(prompt, tokens, False), protocol="grpc")
        done[name] = time.monotonic()
        return anchor.text_of(result)

    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(infer, "long", "def long(x):\n", UNARY_LONG)
        time.sleep(1.0)  # the long generation is running
        deaths.check()
        assert not long.done(), "the long generation ended within a second"
        short = pool.submit(infer, "short", "def short(x):\n", 2)
        assert short.result(timeout=60)
        assert not long.done(), "the short request was answered only after the long generation"
        assert long.result(timeout=300)
    assert done["short"] < done["long"], done
