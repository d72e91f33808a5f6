"""Canary versions through the real tritonserver: the router's weighted split and sticky keys, version pins, and
promotion / rollback under a bounded load of streams with zero failed requests (docs/canary.md).

Own server (explicit model control, repository rendered with the router); versions 2 and 3 serve the demo checkpoint
again (a build installed as a new version): what differs is the version number each response reports.
"""
from __future__ import annotations

import collections
import queue
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backend.formats.versions import install_version
from backend.serving.router_metrics import INFLIGHT
from ensembles.canary import CanaryController, ControlOptions
from ensembles.canary_cli import main as canary_main
from ensembles.canary_render import render_canary
from ensembles.render import RepoSpec
from ensembles.server import ServerOptions, TritonServer
from tests.integration import metrics
from tests.integration.anchor_calls import index_of
from tests.integration.conftest import _free_ports
from tests.integration.launcher import wait_for
from tests.integration.stub_deaths import StubDeaths, StubDied
from tests.integration.trtllm_direct import stream_infer, tensor

STREAMS = 16


ADMIN_KEY = "canary-test-admin-key"  # the server restricts model control, as `python -m ensembles serve` does


def start_canary_server(demo, root: Path) -> tuple[TritonServer, CanaryController]:
    """A canary repository of `demo` under root (versions 2 and 3 installed as new builds), served with explicit
    model control (also perf/probes/bls_deadlock.py's server)."""
    # max_seq_len 2048 and a KV cache for 8 of them at once: the cancellation test's long generations.
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=16,
                    max_input_len=256, max_seq_len=2048, max_num_tokens=512, max_tokens_in_paged_kv_cache=16384)
    repo = render_canary(spec, root / "model_repository")
    for version in (2, 3):
        install_version(repo, demo.engine_dir, version=version, meta={"note": "same checkpoint, new version"})
    srv = TritonServer(ServerOptions(repo, *_free_ports(3), model_control_mode="explicit", admin_key=ADMIN_KEY),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "router", "tensorrt_llm"))
    return srv, CanaryController(ControlOptions(srv.http_url, repo, admin_key=ADMIN_KEY, drain_s=0.5))


@pytest.fixture(scope="module")
def canary(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("canary")
    srv, control = start_canary_server(demo, root)
    deaths = StubDeaths(srv.proc.pid)  # a model process that dies fails the test at once, naming it (no hang)
    yield srv, control, deaths
    deaths.close()
    control.close()
    srv.stop()
    log = (root / "tritonserver.log").read_text(errors="replace")
    assert not deaths.died, f"{deaths.died}; log: {log[-4000:]}"
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]


class Stream:
    """One gRPC stream sending requests one after another; each returns its versions seen, or raises its error."""

    def __init__(self, url: str, deaths: StubDeaths) -> None:
        self.deaths = deaths
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def generate(self, max_tokens: int = 1, stream: bool = False, parameters: dict | None = None,
                 **extra: np.ndarray) -> list[int]:
        inputs = {"text_input": np.array([[b"def "]], dtype=object),
                  "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[stream]]), **extra}
        self.client.async_stream_infer("ensemble", [tensor(k, v) for k, v in inputs.items()],
                                       request_id=uuid.uuid4().hex, parameters=parameters,
                                       enable_empty_final_response=True)
        versions = []
        while True:
            result, error = self.deaths.get(self.responses, timeout_s=120)
            if error is not None:
                raise error
            if result.as_numpy("served_version") is not None:
                versions.append(int(result.as_numpy("served_version").reshape(-1)[0]))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return versions

    def close(self) -> None:
        # A request of a dead model process never ends, nor would a stream waiting for it: cancel it then.
        self.client.stop_stream(cancel_requests=bool(self.deaths.died))
        self.client.close()


def _served(url: str, deaths: StubDeaths, count: int, **kwargs) -> collections.Counter:
    """Versions serving `count` requests sent over STREAMS concurrent streams."""
    def run(n: int) -> list[int]:
        stream = Stream(url, deaths)
        try:
            return [stream.generate(**kwargs)[-1] for _ in range(n)]
        finally:
            stream.close()

    shares = [count // STREAMS + (i < count % STREAMS) for i in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        return collections.Counter(v for part in pool.map(run, shares) for v in part)


class Load:
    """STREAMS streams generating (streamed, a few tokens) until stopped; counts completed and failed requests."""

    def __init__(self, url: str, deaths: StubDeaths) -> None:
        self.url, self.deaths, self.stop_event = url, deaths, threading.Event()
        self.done: collections.Counter = collections.Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(STREAMS)]

    def _run(self) -> None:
        stream = Stream(self.url, self.deaths)
        try:
            while not self.stop_event.is_set():
                try:
                    versions = stream.generate(max_tokens=4, stream=True)
                    assert len(set(versions)) == 1, f"one request, several versions: {versions}"
                    with self.lock:
                        self.done[versions[-1]] += 1
                except Exception as exc:  # noqa: BLE001 -- every failure is counted and reported
                    with self.lock:
                        self.failures.append(repr(exc))
                    if isinstance(exc, StubDied):
                        return
        finally:
            stream.close()

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=120)


def _pin_error(srv, deaths: StubDeaths, **kwargs) -> InferenceServerException:
    stream = Stream(srv.grpc_url, deaths)
    try:
        with pytest.raises(InferenceServerException) as info:
            stream.generate(**kwargs)
        return info.value
    finally:
        stream.close()


def test_starts_serving_version_1_with_the_anchor_outputs(canary):
    srv, control, deaths = canary
    stream = Stream(srv.grpc_url, deaths)
    try:
        assert stream.generate(max_tokens=2) == [1]
    finally:
        stream.close()
    assert control.status()["loaded"] == [1]


def test_several_sequences_and_rows_all_arrive_through_the_router(canary):
    """The router ends a forwarded request after one final response per row and returned sequence."""
    srv, _, _ = canary
    inputs = {"text_input": np.array([[b"def "], [b"import "]], dtype=object),
              "max_tokens": np.array([[3], [3]], dtype=np.int32),
              "num_return_sequences": np.array([[2], [1]], dtype=np.int32),
              "top_k": np.array([[40], [40]], dtype=np.int32), "seed": np.array([[1], [2]], dtype=np.uint64)}
    results = stream_infer(srv.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])
    rows = sorted((index_of(r, "batch_index"), index_of(r, "sequence_index")) for r in results
                  if r.as_numpy("text_output") is not None)  # absent for one sequence, as the anchor: index 0
    assert rows == [(0, 0), (0, 1), (1, 0)], rows
    assert all(int(r.as_numpy("served_version")[0, 0]) == 1 for r in results if r.as_numpy("text_output") is not None)


def test_pinned_unknown_version_is_invalid_arg(canary):
    srv, _, deaths = canary
    for kwargs in ({"pin_version": np.array([[7]], dtype=np.int32)}, {"parameters": {"model_version": 7}}):
        assert "model_version 7 is not served; served versions: [1]" in _pin_error(srv, deaths, **kwargs).message()
    # HTTP generate: JSON fields that are not inputs become request parameters; 400 is Triton's INVALID_ARG.
    for extra in ({"pin_version": 7}, {"model_version": 7}):
        resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate",
                             json={"text_input": "def ", "max_tokens": 1, **extra}, timeout=60)
        assert resp.status_code == 400 and "model_version 7 is not served" in resp.json()["error"], resp.text
    resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate",
                         json={"text_input": "def ", "max_tokens": 1, "model_version": 1}, timeout=60)
    assert resp.status_code == 200 and resp.json()["served_version"] == 1, resp.text


def test_cli_refuses_unknown_version_and_bad_weight(canary, capsys):
    srv, control, _ = canary
    base = ["--url", srv.http_url, "--model-repository", str(control.opts.model_repository)]
    assert canary_main(base + ["status"]) == 2  # model control is behind the admin key
    assert "server refused" in capsys.readouterr().err
    base += ["--admin-key", ADMIN_KEY]
    for argv, message in ((["start", "--version", "9", "--weight", "10"], "version 9 of tensorrt_llm is not installed"),
                          (["start", "--version", "2", "--weight", "101"], "weight must be an integer in [0, 100]"),
                          (["set-weight", "-1"], "weight must be an integer in [0, 100]"),
                          (["set-weight", "20"], "no canary running"),
                          (["promote"], "no canary running")):
        assert canary_main(base + argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert control.status()["loaded"] == [1]


def test_weighted_split_within_3_points_and_sticky_keys(canary, capsys):
    srv, control, deaths = canary
    control.start(version=2, weight=30)
    assert control.status()["loaded"] == [1, 2]
    counts = _served(srv.grpc_url, deaths, 1000)
    assert sum(counts.values()) == 1000
    assert abs(counts[2] / 1000 - 0.30) <= 0.03, counts
    keys = [f"session-{i}" for i in range(40)]
    first = {k: v for k, v in zip(keys, _first_versions(srv, deaths, keys))}
    for _ in range(3):
        assert dict(zip(keys, _first_versions(srv, deaths, keys))) == first
    assert set(first.values()) == {1, 2}, first  # 40 keys at 70/30: both versions get some
    for _ in range(3):  # a request parameter is a key too (Triton passes request parameters down the ensemble)
        assert _first_versions(srv, deaths, keys[:8], as_parameter=True) == [first[k] for k in keys[:8]]
    assert canary_main(["--url", srv.http_url, "--model-repository", str(control.opts.model_repository),
                        "--admin-key", ADMIN_KEY, "compare",
                        "--metrics-url", f"http://localhost:{srv.opts.metrics_port}/metrics"]) in (0, 3, 4)
    report = capsys.readouterr().out
    assert '"verdict"' in report and '"requests": 0' not in report, report
    with capsys.disabled():
        print(f"\nsplit over 1000 requests at 70/30: {dict(counts)}\ncanary compare: {report}")


def _first_versions(srv, deaths: StubDeaths, keys: list[str], as_parameter: bool = False) -> list[int]:
    stream = Stream(srv.grpc_url, deaths)
    try:
        if as_parameter:
            return [stream.generate(parameters={"session_id": k})[-1] for k in keys]
        return [stream.generate(session_id=np.array([[k.encode()]], dtype=object))[-1] for k in keys]
    finally:
        stream.close()


def test_cancelled_streams_stop_on_the_version_serving_them(canary):
    """postprocessing sends `stop` (by request_key) to the router, which forwards it to the serving version: the
    forwarded requests end within seconds, where their 1,900 tokens each would take far longer (8 x 1,900 tokens
    in 5 s is over twice the fastest rate measured here, perf/RESULTS.md)."""
    srv, control, _ = canary
    port = srv.opts.metrics_port
    assert control.table().canary == 2  # two versions serve, 70/30
    got_tokens = threading.Semaphore(0)
    clients = []
    try:
        for i in range(8):
            client = grpcclient.InferenceServerClient(srv.grpc_url)
            clients.append(client)
            client.start_stream(callback=lambda result, error: got_tokens.release())
            inputs = {"text_input": np.array([[f"def cancelled_{i}(x):\n".encode()]], dtype=object),
                      "max_tokens": np.array([[1900]], dtype=np.int32), "stream": np.array([[True]])}
            client.async_stream_infer("ensemble", [tensor(k, v) for k, v in inputs.items()])
        for _ in range(16):
            assert got_tokens.acquire(timeout=120)

        def busy() -> dict[str, float]:
            return {v: metrics.value(metrics.scrape(port), INFLIGHT, served_version=v) or 0 for v in ("1", "2")}

        # 16 tokens can come from the first streams while the last request is still on its way to a version
        assert wait_for(lambda: sum(busy().values()) == 8, 30, 0.1), busy()
    finally:
        for client in clients:
            client.stop_stream(cancel_requests=True)
            client.close()
    for version in ("1", "2"):
        assert metrics.wait_for(port, INFLIGHT, 0.0, timeout_s=5.0, served_version=version) == 0.0, version


def test_promote_under_load_fails_no_request(canary):
    srv, control, deaths = canary
    with Load(srv.grpc_url, deaths) as load:
        control.set_weight(50)
        _wait_for_requests(load, 2, 20)
        control.promote()
        _wait_for_requests(load, 2, 40)
    assert load.failures == [], load.failures[:5]
    assert load.done[1] > 0 and load.done[2] > 0, load.done
    print(f"promotion under {STREAMS} streams: requests served per version {dict(load.done)}, 0 failed")
    assert control.status()["loaded"] == [2] and control.table().stable == 2
    config = (control.opts.model_repository / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "versions: [ 2 ]" in config  # a restarted server loads the version the table routes to
    assert _served(srv.grpc_url, deaths, 32) == {2: 32}


def test_rollback_under_load_fails_no_request(canary):
    srv, control, deaths = canary
    with Load(srv.grpc_url, deaths) as load:
        control.start(version=3, weight=50)
        _wait_for_requests(load, 3, 20)
        control.rollback()
        _wait_for_requests(load, 2, 40)
    assert load.failures == [], load.failures[:5]
    assert load.done[3] > 0, load.done
    print(f"rollback under {STREAMS} streams: requests served per version {dict(load.done)}, 0 failed")
    assert control.status()["loaded"] == [2] and control.table().canary is None
    assert _served(srv.grpc_url, deaths, 32) == {2: 32}
    error = _pin_error(srv, deaths, pin_version=np.array([[3]], dtype=np.int32))
    assert "model_version 3 is not served" in error.message()


def _wait_for_requests(load: Load, version: int, more: int, timeout_s: float = 120.0) -> None:
    """Until `more` further requests were served by `version` (the load keeps running meanwhile)."""
    import time

    with load.lock:
        target = load.done[version] + more
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with load.lock:
            if load.done[version] >= target or load.failures:
                return
        time.sleep(0.05)
    raise TimeoutError(f"version {version} served {load.done[version]} < {target} requests")


def canary_cycle(srv, control, deaths: StubDeaths, cycle: int, stall_s: float = 60.0) -> str | None:
    """A canary started under load, then promoted (odd cycles) or rolled back; an error line, or None.
    A hang (requests not served for stall_s) kills the server: its hung streams would hold the load's threads."""
    stable = control.table().stable
    canary = 3 if stable != 3 else 2
    survivor = canary if cycle % 2 else stable
    with Load(srv.grpc_url, deaths) as load:
        try:
            control.start(version=canary, weight=50)
            _wait_for_requests(load, canary, 20, timeout_s=stall_s)
            (control.promote if cycle % 2 else control.rollback)()
            _wait_for_requests(load, survivor, 40, timeout_s=stall_s)
        except TimeoutError as exc:
            srv.stop(timeout_s=0)
            return f"hung: {exc}; served per version {dict(load.done)}"
    if load.failures:
        return f"failed requests: {load.failures[:3]}"
    return None


def test_canary_cycles_with_busy_cores_never_hang(canary):
    """The router streams BLS calls; from several threads of one process that deadlocked in Triton 2.51's Python
    backend (docs/canary.md, "Limits"), in 3 of 17 such cycles of perf/probes/bls_deadlock.py with two busy processes
    beside the server. The last test of the module: a hang stops its server."""
    srv, control, deaths = canary
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for cycle in range(8):
            error = canary_cycle(srv, control, deaths, cycle)
            assert error is None, f"cycle {cycle}: {error}"
    finally:
        for hog in hogs:
            hog.kill()
