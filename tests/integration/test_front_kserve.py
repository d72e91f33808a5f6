"""The public HTTP front (KServe v2 proxy) before the real tritonserver: issue 11's HTTP findings, each sent to the
public HTTP port as a client would; tritonclient.http (binary tensors, compression) and SSE passing through.

On a bare tritonserver 2.51 these fail: the nested body kills the server (SIGSEGV), integers wrap around INT32,
malformed / mistyped JSON get 500, and 100,000 unknown fields cost ~40 s of CPU."""
from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import GenerationRequest, GrpcLLMClient, HttpLLMClient
from tests.integration.oracle import hf_text


def _generate(server, body: bytes | dict, endpoint: str = "generate") -> requests.Response:
    url = f"http://{server.http_url}/v2/models/ensemble/{endpoint}"
    if isinstance(body, dict):
        return requests.post(url, json=body, timeout=120)
    return requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)


def _error(resp: requests.Response) -> str:
    """The error message of a refused request: a JSON body, or (generate_stream refused by a model, as Triton
    answers it) one server-sent event carrying the JSON."""
    text = resp.text.strip()
    return json.loads(text.removeprefix("data:").strip())["error"]


def _still_serves(server, hf) -> None:
    assert HttpLLMClient(server.http_url).generate(GenerationRequest("def ", 8)) == hf_text(hf, "def ", 8)


def test_deeply_nested_body_is_refused_and_the_server_serves_on(server, hf):
    body = b'{"text_input":"a","max_tokens":8,"x":' + b"[" * 200_000 + b"]" * 200_000 + b"}"  # ~400 KB
    resp = _generate(server, body)
    assert resp.status_code == 400 and "nested more than" in resp.json()["error"], resp.text[:300]
    assert server.triton.proc.poll() is None  # tritonserver is alive
    _still_serves(server, hf)
    assert "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(GenerationRequest("def ", 8))) \
        == hf_text(hf, "def ", 8)


@pytest.mark.parametrize("field, value", [("max_tokens", 4294967304), ("end_id", 4294967296),
                                          ("beam_width", 4294967297), ("max_tokens", -2**31 - 1),
                                          ("seed", 2**64), ("seed", -1)])
def test_integers_out_of_their_input_range_are_refused_naming_the_field(server, field, value):
    body = {"text_input": "def ", "max_tokens": 8, field: value}
    resp = _generate(server, body)
    assert resp.status_code == 400, resp.text
    assert f"{field} is out of range" in resp.json()["error"], resp.text


@pytest.mark.parametrize("body, needle", [
    (b'{"text_input": "def ", "max_tokens": 8', "malformed JSON"),
    (b'{"text_input": "def ", "max_tokens": NaN}', "not JSON"),
    (b'[1, 2]', "must be a JSON object"),
    (b'{"text_input": "def ", "max_tokens": "8"}', "max_tokens must be an integer"),
    (b'{"text_input": 5, "max_tokens": 8}', "text_input must be a string"),
    (b'{"text_input": "def ", "max_tokens": 8, "temperature": "hot"}', "temperature must be a number"),
    (b'{"text_input": "def ", "max_tokens": 8, "stream": 1}', "stream must be true or false"),
    (b'{"text_input": "def ", "max_tokens": 8, "max_tokens": 9}', "twice"),
    (b'{"text_input": "def "}', "max_tokens (REQUEST_OUTPUT_LEN) is required"),  # optional in the ensemble's
    # config (as the anchor's), refused by preprocessing naming it
    (b'\xff\xfe{}', "not UTF-8"),
])
def test_malformed_and_mistyped_json_get_400(server, body, needle):
    for endpoint in ("generate", "generate_stream"):
        resp = _generate(server, body, endpoint)
        assert resp.status_code == 400 and needle in _error(resp), (endpoint, resp.status_code, resp.text)


def test_many_unknown_fields_are_refused_at_once(server, hf):
    fields = {f"f{i}": i for i in range(100_000)}
    start = time.monotonic()
    resp = _generate(server, json.dumps({"text_input": "def ", "max_tokens": 8, **fields}).encode())
    elapsed = time.monotonic() - start
    print(f"100,000 unknown fields refused in {elapsed:.2f} s")
    assert resp.status_code == 400 and "more than 1024 object keys" in resp.json()["error"]
    assert elapsed < 10  # Triton alone spends ~40 s of CPU on this body
    one = _generate(server, {"text_input": "def ", "max_tokens": 8, "colour": "blue"})
    assert one.status_code == 400 and "unknown field 'colour'" in one.json()["error"]
    _still_serves(server, hf)


def test_body_over_the_size_limit_gets_413(server):
    resp = _generate(server, b'{"text_input": "' + b"x" * (17 * 1024 * 1024) + b'", "max_tokens": 8}')
    assert resp.status_code == 413 and "larger than the limit" in resp.json()["error"]


def test_request_parameters_still_reach_the_models(server):
    resp = _generate(server, {"text_input": "def ", "max_tokens": 2, "tenant_id": "../etc"})
    assert resp.status_code == 400 and "tenant id" in resp.json()["error"]  # the policy layer saw it
    claimed = _generate(server, {"text_input": "def ", "max_tokens": 2, "tenant_id": "someone"})
    assert claimed.status_code == 400 and "honoured only from the trusted front" in claimed.json()["error"]
    ok = _generate(server, {"text_input": "def ", "max_tokens": 2, "timeout_ms": 60000})
    assert ok.status_code == 200, ok.text


def test_generate_stream_passes_events_through_unbuffered(server):
    # First the non-streamed answer to compare with; it also warms the server, so the stream's first event is not
    # a cold start's.
    expected = HttpLLMClient(server.http_url).generate(GenerationRequest("def ", 256, min_tokens=256))
    url = f"http://{server.http_url}/v2/models/ensemble/generate_stream"
    arrivals, texts = [], []
    sent = time.monotonic()
    with requests.post(url, json={"text_input": "def ", "max_tokens": 256, "min_tokens": 256, "stream": True},
                       stream=True, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines(chunk_size=None):
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic())
                texts.append(json.loads(line[6:])["text_output"])
    assert len(texts) >= 32
    # Buffered, every event would arrive at once at the end; streamed, they spread over the generation: the first
    # comes in the first half of the request's time. Relative, since a fixed spread (0.1 s over 64 tokens) was
    # beaten by a Zen 5 EPYC's whole generation.
    assert arrivals[0] - sent < 0.5 * (arrivals[-1] - sent), (arrivals[0] - sent, arrivals[-1] - sent)
    assert "".join(texts) == expected


def _preprocessing_inputs(client_module, binary: bool) -> list:
    query = client_module.InferInput("QUERY", [1, 1], "BYTES")
    query.set_data_from_numpy(np.array([[b"def fib(n):"]], dtype=object), binary_data=binary)
    length = client_module.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32")
    length.set_data_from_numpy(np.array([[8]], dtype=np.int32), binary_data=binary)
    return [query, length]


@pytest.mark.parametrize("binary, compression", [(True, None), (False, None), (True, "gzip"), (False, "deflate")])
def test_tritonclient_http_infer_through_the_front(server, hf, binary, compression):
    """Unary infer on the (non-decoupled) preprocessing model: JSON and binary-extension tensors, compressed bodies."""
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_model_ready("preprocessing")
    assert client.get_model_metadata("ensemble")["name"] == "ensemble"
    outputs = [httpclient.InferRequestedOutput("INPUT_ID", binary_data=binary)]
    result = client.infer("preprocessing", _preprocessing_inputs(httpclient, binary), outputs=outputs,
                          request_compression_algorithm=compression, response_compression_algorithm=compression)
    expected = hf[1].encode("def fib(n):", add_special_tokens=False)
    assert result.as_numpy("INPUT_ID").reshape(-1).tolist() == expected
    client.close()


def test_infer_bodies_are_validated_against_the_declared_inputs(server):
    client = httpclient.InferenceServerClient(server.http_url)
    bad = httpclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT64")
    bad.set_data_from_numpy(np.array([[8]], dtype=np.int64), binary_data=False)
    with pytest.raises(InferenceServerException, match="has datatype 'INT64', the model declares INT32"):
        client.infer("preprocessing", [_preprocessing_inputs(httpclient, False)[0], bad])
    url = f"http://{server.http_url}/v2/models/preprocessing/infer"
    body = {"inputs": [{"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]},
                       {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [4294967304]}]}
    resp = requests.post(url, json=body, timeout=60)
    assert resp.status_code == 400 and "out of range for INT32" in resp.json()["error"]
    body["inputs"][1]["data"] = [8, 9]
    resp = requests.post(url, json=body, timeout=60)
    assert resp.status_code == 400 and "its shape [1, 1] needs 1" in resp.json()["error"]
    client.close()


def _non_loopback_address() -> str | None:
    """An address of this machine other than loopback (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP: no packet is sent; picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_triton_http_listens_on_loopback_only(server):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to test from")
    assert requests.get(f"http://{address}:{server.front_opts.http_port}/v2/health/ready", timeout=10).ok
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{address}:{server.opts.http_port}/v2/health/ready", timeout=10)
    assert requests.get(f"http://{address}:{server.opts.metrics_port}/metrics", timeout=10).ok


def test_a_response_is_compressed_only_when_the_client_asks(server):
    """Triton compresses infer responses when asked; the front must not ask on behalf of a client that did not
    (found: gzip bodies relayed to clients that never sent Accept-Encoding)."""
    import http.client

    path = "/v2/models/preprocessing/infer"
    body = json.dumps({"inputs": [{"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": ["def f"]},
                                  {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [4]}]})
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", path, skip_accept_encoding=True)  # no Accept-Encoding at all, as curl sends
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body.encode())
    resp = conn.getresponse()
    assert resp.getheader("Content-Encoding") is None
    assert "INPUT_ID" in {o["name"] for o in json.loads(resp.read())["outputs"]}
    conn.close()
    asked = requests.post(f"http://{server.http_url}{path}", data=body, headers={"Accept-Encoding": "gzip"}, timeout=60)
    assert asked.headers.get("Content-Encoding") == "gzip" and "INPUT_ID" in {o["name"] for o in asked.json()["outputs"]}
