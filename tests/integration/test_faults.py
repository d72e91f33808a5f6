"""Dead model processes and SIGTERM under load (issue 11 items 5 and 6), through `python -m ensembles serve` (and
`make serve`) with the real tritonserver. Each test starts its own launcher and kills or signals only the processes
that launcher started: the tritonserver it runs and that server's model processes (tests/integration/launcher.py).

Findings (on the code before the launcher supervised tritonserver): kill -9 of the tensorrt_llm model process left
in-flight streams hanging with no error, /v2/health/ready answering 200, and every new request failing for as long
as the server lived; SIGTERM left in-flight streams without tokens or an error until clients gave up.
"""
from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ensembles.render import RepoSpec, render
from ensembles.supervisor import ABORT_SETTLE_S, ACK_TIMEOUT_S, SupervisorOptions
from tests.integration.launcher import REPO_ROOT, Launcher, alive, wait_for
from tests.integration.oracle import hf_text
from tests.integration.tenant_client import Outcome, generate

ERROR_AT_ONCE_S = 10.0  # a killed model's in-flight streams end with an error within this (measured: 1.3 s)
NOT_READY_S = 5.0  # readiness turns false within this after a model process dies (measured: 1.3 s)
BACK_S = 300.0  # a restarted server is ready again within this (measured: 25 s idle, 58 s with load 6)
GRACE_S = 3.0
SHORT_TOKENS = 16  # a stream that finishes well within GRACE_S beside 15 others
# A stream that must outlast GRACE_S: as many tokens as `make serve`'s max_seq_len (2048) holds after the prompt,
# since a fixed 1000 ended within an 8 s grace on a Zen 5 EPYC.
LONG_TOKENS = 2000
RESTART_FAILED = 3  # ensembles.supervisor.EXIT_FAILED


@pytest.fixture(scope="module")
def repo(demo, tmp_path_factory):
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=16,
                    max_input_len=512, max_seq_len=1024, cancellation_check_period_ms=20)
    return render(spec, tmp_path_factory.mktemp("faults") / "model_repository")


@pytest.fixture
def launch(repo, tmp_path):
    started = []

    def start(*extra_args: str, command=None) -> Launcher:
        """command(ports) -> argv, to start something else than `python -m ensembles serve`."""
        launcher = Launcher(repo, tmp_path / f"launcher-{len(started)}.log", extra_args)
        launcher.command = tuple(command(*launcher.ports)) if command else None
        started.append(launcher)
        return launcher.start()

    yield start
    for launcher in started:
        launcher.teardown()


def _streams(launcher: Launcher, pool: ThreadPoolExecutor, n: int, max_tokens: int, **kwargs) -> list:
    long = {"min_tokens": np.array([[max_tokens]], dtype=np.int32)}  # never ends early at an end token
    return [pool.submit(_timed, launcher.grpc_url, f"def stream_{i}(x):\n", max_tokens, stream=True,
                        timeout_s=BACK_S, **long, **kwargs) for i in range(n)]


def _timed(*args, **kwargs) -> tuple[Outcome, float]:
    out = generate(*args, **kwargs)
    return out, time.monotonic()


def _generating(launcher: Launcher, n: int) -> bool:
    from tests.integration import metrics

    active = metrics.value(metrics.scrape(launcher.ports[2]), "nv_trt_llm_request_metrics", request_type="active")
    return active is not None and active >= n


def test_dead_llm_process_fails_in_flight_at_once_and_the_server_comes_back(launch, hf):
    launcher = launch()
    with ThreadPoolExecutor(4) as pool:
        streams = _streams(launcher, pool, 4, 400)
        assert wait_for(lambda: _generating(launcher, 4), 60), "the streams never started"
        launcher.stub("tensorrt_llm").kill()  # SIGKILL: the model process of the server this test started
        killed = time.monotonic()
        assert wait_for(lambda: launcher.triton_ready() != 200 and launcher.health_ready() == 503, NOT_READY_S, 0.1)
        not_ready_s = time.monotonic() - killed
        ended = [f.result(timeout=ERROR_AT_ONCE_S + 30) for f in streams]
    assert all(not out.ok for out, _ in ended), "a stream of the dead model finished?"
    assert max(at for _, at in ended) - killed < ERROR_AT_ONCE_S, [at - killed for _, at in ended]
    print(f"readiness false after {not_ready_s:.1f} s; errors after "
          f"{max(at for _, at in ended) - killed:.1f} s: {ended[0][0].error}")
    assert wait_for(lambda: launcher.triton_ready() == 200 and launcher.health_ready() == 200, BACK_S, 0.5), \
        launcher.log_path.read_text()[-3000:]
    print(f"serving again after {time.monotonic() - killed:.1f} s")
    out = generate(launcher.grpc_url, "def fibonacci(n):", 24)
    assert out.ok and "".join(out.texts) == hf_text(hf, "def fibonacci(n):", 24)
    log = launcher.log_path.read_text()
    # The launcher restarts the dead model's process. tritonserver 2.51 itself may abort first, when the stub died
    # holding its Python backend's shared-memory lock (boost::interprocess::lock_exception, then SIGABRT; seen once,
    # CI of 2026-11-26): then the launcher restarts tritonserver. Either way the server serves again (above).
    assert "restarting: the tensorrt_llm v1 model process" in log or (
        "boost::interprocess::lock_exception" in log and "restarting: tritonserver exited with code -6" in log), \
        log[-3000:]


def test_dead_postprocessing_process_with_no_restarts_left_exits_non_zero(launch):
    """--max-restarts 0: the launcher leaves the restart to a service manager (systemd Restart=on-failure,
    Kubernetes): in-flight requests end with an error, the launcher exits 3 and leaves no model process.
    The process dies as a crash does (SIGSEGV): its Python stacks are in the log (faulthandler, which the rendered
    tritonllm_env.py turns on; the stub ignores PYTHONFAULTHANDLER)."""
    launcher = launch("--max-restarts", "0")
    server, stubs = launcher.server(), launcher.stubs()
    with ThreadPoolExecutor(4) as pool:
        streams = _streams(launcher, pool, 4, 400)
        assert wait_for(lambda: _generating(launcher, 4), 60), "the streams never started"
        launcher.stub("postprocessing").send_signal(signal.SIGSEGV)
        killed = time.monotonic()
        ended = [f.result(timeout=ERROR_AT_ONCE_S + 30) for f in streams]
        rc = launcher.proc.wait(30)
    assert rc == RESTART_FAILED
    assert all(not out.ok for out, _ in ended) and max(at for _, at in ended) - killed < ERROR_AT_ONCE_S
    print("in-flight error:", ended[0][0].error)
    assert not alive(server) and not any(alive(s) for s in stubs)
    assert launcher.triton_ready() == 0  # nothing listens any more
    log = launcher.log_path.read_text(errors="replace")
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]


def test_sigterm_via_make_serve_drains_then_exits_cleanly(launch, tmp_path):
    """SIGTERM to `make serve` (make passes it on): no new request is admitted, readiness turns false, short
    in-flight streams finish with their full answer, long ones end with the grace-period error, and the launcher
    exits 0 within the grace period + its own bounded stop steps with no model process left."""
    serve_args = f"--out {tmp_path / 'repo'} --shutdown-grace-s {GRACE_S:g} --max-batch-size 16 --admin-key k"
    launcher = launch(command=lambda http, grpc, metrics, health, triton_http, openai: (
        "make", "-s", "-C", str(REPO_ROOT), "serve", f"HTTP_PORT={http}", f"GRPC_PORT={grpc}",
        f"METRICS_PORT={metrics}", f"HEALTH_PORT={health}", f"TRITON_HTTP_PORT={triton_http}",
        f"OPENAI_PORT={openai}", f"SERVE_ARGS={serve_args}"))
    server, stubs = launcher.server(), launcher.stubs()
    short_args = ("import os\n", SHORT_TOKENS)
    forced = {"min_tokens": np.array([[SHORT_TOKENS]], dtype=np.int32)}
    reference = generate(launcher.grpc_url, *short_args, **forced)  # alone, before the load
    assert reference.ok and reference.texts
    with ThreadPoolExecutor(16) as pool:
        long = _streams(launcher, pool, 8, LONG_TOKENS)
        assert wait_for(lambda: _generating(launcher, 8), 60)
        begun = [threading.Event() for _ in range(8)]
        short = [pool.submit(_timed, launcher.grpc_url, *short_args, stream=True, first_text=event, **forced)
                 for event in begun]
        assert all(event.wait(60) for event in begun)  # the short ones are in (a client's sign: no metrics poll)
        launcher.signal(signal.SIGTERM)
        sent = time.monotonic()
        # Readiness turns false once every model process saw "draining", at the latest after ACK_TIMEOUT_S.
        assert wait_for(lambda: launcher.health_ready() == 503, ACK_TIMEOUT_S + 1.0, 0.05), \
            launcher.log_path.read_text()[-3000:]
        refused = generate(launcher.grpc_url, "def late(", 4)
        short, long = [f.result(timeout=60) for f in short], [f.result(timeout=60) for f in long]
        launcher.proc.wait(GRACE_S + 30)
    exited_s = time.monotonic() - sent
    assert not refused.ok and "not admitting new requests: shutting down on SIGTERM" in refused.error, refused.error
    expected = "".join(reference.texts)
    assert all(out.ok and "".join(out.texts) == expected for out, _ in short), [o.error for o, _ in short]
    assert all(not out.ok and f"the {GRACE_S:g} s shutdown grace period ended" in out.error for out, _ in long), \
        [o.error for o, _ in long]
    assert all(GRACE_S - 0.5 <= at - sent < GRACE_S + 5 for _, at in long), [at - sent for _, at in long]
    acks = [line for line in launcher.log_path.read_text().splitlines() if "saw draining" in line]
    print(f"launcher exited {exited_s:.1f} s after SIGTERM (grace {GRACE_S:g} s); {acks}; long streams: {long[0][0].error}"
          f"; their responses before it: {[len(out.texts) for out, _ in long]} (of up to {LONG_TOKENS} tokens)")
    # The launcher's own bounded steps after the grace period: the aborted requests' settling, the front's stop and
    # tritonserver's (each killed after stop_timeout_s; Triton's unload of its five models took 5-6 s on the 2-core
    # AVX2 VM, so it is killed there), plus 3 s for the processes' exits: measured 17.3-18.1 s with grace 8.
    assert exited_s < GRACE_S + ABORT_SETTLE_S + 0.2 + 2 * SupervisorOptions().stop_timeout_s + 3
    assert "stopped: shutting down on SIGTERM" in launcher.log_path.read_text()
    assert not alive(server) and not any(alive(s) for s in stubs)
