"""Errors of accepted requests in the ensemble (backend/serving/stream_errors.py), plain and canary repositories.

Triton 2.51's ensemble keeps a request in flight for good when a step errors while another step of that request
still runs: a stream whose deadline passed while postprocessing handled its previous tokens held the ensemble (it
never unloaded, and the server's stop waited out its 30 s exit timeout). tensorrt_llm now sends such an error as
its stream's last response, which postprocessing answers with the error.
"""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ensembles.canary_render import render_canary
from ensembles.render import RepoSpec, render
from ensembles.server import GRPC_ADMIN_HEADER, ServerOptions, TritonServer
from tests.integration.conftest import _free_ports, model_state, stopped_cleanly
from tests.integration.launcher import wait_for
from tests.integration.tenant_client import generate
from tests.integration.trtllm_direct import tensor

ADMIN_KEY = "stream-errors-admin-key"
DEADLINE = "request timed out: its deadline (timeout_ms="


@pytest.fixture(scope="module", params=["plain", "canary"])
def server(request, demo, tmp_path_factory) -> TritonServer:
    root = tmp_path_factory.mktemp(f"stream-errors-{request.param}")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=256, max_seq_len=1024, max_num_tokens=512, cancellation_check_period_ms=20,
                    router_instance_count=8)
    if request.param == "canary":
        repo, models = render_canary(spec, root / "model_repository"), ("ensemble", "router", "tensorrt_llm")
    else:
        repo, models = render(spec, root / "model_repository"), ("ensemble", "tensorrt_llm", "postprocessing")
    srv = TritonServer(ServerOptions(repo, *_free_ports(3), model_control_mode="explicit", admin_key=ADMIN_KEY),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=models)
    yield srv
    srv.stop()
    assert "successfully unloaded 'tensorrt_llm'" in stopped_cleanly(root / "tritonserver.log")


def _deadline_stream(url: str, i: int):
    """A stream that ends by its deadline after some tokens (900 tokens take far longer than 1.5-2.2 s on a CPU;
    its first ones come well before, on a busy 2-core machine too); the first one asks for two sequences."""
    extra = {"num_return_sequences": np.array([[2]], dtype=np.int32)} if i == 0 else {}
    return generate(url, f"def slow_{i}(x):\n", 900, stream=True, parameters={"timeout_ms": 1500 + 97 * i}, **extra)


def test_streams_ended_by_their_deadlines_leave_the_ensemble_free_to_unload(server):
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(partial(_deadline_stream, server.grpc_url), range(8)))
    assert all(not o.ok and DEADLINE in o.error for o in outs), [o.error for o in outs]
    assert all(o.texts for o in outs), [len(o.texts) for o in outs]  # each had streamed text: ended mid-stream
    assert generate(server.grpc_url, "def ", 2).ok  # the others go on
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.unload_model("ensemble", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})  # it waits for its in-flight requests
    unloaded = wait_for(lambda: model_state(client, "ensemble", ADMIN_KEY) == "UNAVAILABLE", timeout_s=20)
    assert unloaded, (f"the ensemble did not unload in 20 s (state {model_state(client, 'ensemble', ADMIN_KEY)!r}): "
                      "a request held it")


def test_a_direct_client_still_gets_a_triton_error(server):
    """Without errors_in_stream (a tensorrtllm_backend client calling tensorrt_llm): the deadline is an error."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    inputs = {"input_ids": np.array([[1, 2, 3, 4]], dtype=np.int32), "input_lengths": np.array([[4]], dtype=np.int32),
              "request_output_len": np.array([[900]], dtype=np.int32), "streaming": np.array([[True]])}
    try:
        client.async_stream_infer("tensorrt_llm", [tensor(k, v) for k, v in inputs.items()],
                                  parameters={"timeout_ms": 1000}, enable_empty_final_response=True)
        results = []
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                break
            assert result.as_numpy("stream_error") is None
            results.append(result)
    finally:
        client.stop_stream()
    assert DEADLINE in str(error) and results, (error, len(results))


@pytest.mark.parametrize("value, expected", [
    (np.array([[b"UNAVAILABLE", b"request timed out: as sent"]], dtype=object), "request timed out: as sent"),
    (np.array([[b"EXIT", b"x"]], dtype=object), "STREAM_ERROR code must be one of INVALID_ARG"),
])
def test_postprocessing_answers_a_stream_error_with_it_or_refuses_it(server, value, expected):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [tensor("TOKENS_BATCH", np.zeros((1, 1, 0), dtype=np.int32)),
              tensor("SEQUENCE_LENGTH", np.zeros((1, 1), dtype=np.int32)), tensor("STREAM_ERROR", value)]
    with pytest.raises(InferenceServerException, match=expected):
        client.infer("postprocessing", inputs)
