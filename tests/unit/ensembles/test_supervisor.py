"""The launcher's supervision, against a fake tritonserver (tests/unit/ensembles/fake_tritonserver.py): a model
process that dies is found (a zombie Triton never reaps) and the server restarted; the restart budget; SIGTERM
drains and stops with nothing left; the health endpoint follows. The real server: tests/integration/test_faults.py."""
from __future__ import annotations

import http.server
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from backend.serving.lifecycle import ServerPhase
from ensembles.health import HealthServer, TritonWatch
from ensembles.server import ServerOptions, TritonInstall, free_ports
from ensembles.stub_watch import StubWatch
from ensembles.supervisor import EXIT_FAILED, EXIT_OK, Supervisor, SupervisorOptions
from tests.integration.launcher import alive, get_status, wait_for

FAKE = Path(__file__).with_name("fake_tritonserver.py")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A Supervisor over the fake server, run on a thread; yields (supervisor, thread, result)."""
    link = tmp_path / "bin" / "triton_python_backend_stub"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    wrapper = tmp_path / "bin" / "tritonserver"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("FAKE_STUB_LINK", str(link))
    (tmp_path / "repo").mkdir()
    made = []

    def make(cpus: frozenset[int] | None = None, **sup) -> tuple[Supervisor, dict]:
        http, grpc, metrics, health = free_ports(4)
        opts = ServerOptions(tmp_path / "repo", http, grpc, metrics, cpus=cpus)
        supervisor = Supervisor(opts, SupervisorOptions(poll_s=0.1, health_port=health, **sup),
                                TritonInstall(binary=wrapper, backend_dir=None))
        result: dict = {}
        thread = threading.Thread(target=lambda: result.setdefault("rc", supervisor.run()), daemon=True)
        thread.start()
        made.append((supervisor, thread))
        assert wait_for(lambda: supervisor.state == "serving", 30), supervisor.current()
        return supervisor, result

    yield make
    for supervisor, thread in made:
        supervisor.on_signal(signal.SIGTERM)
        supervisor.on_signal(signal.SIGTERM)
        thread.join(30)


def _stub(supervisor: Supervisor, model: str) -> psutil.Process:
    return next(p for p in psutil.Process(supervisor.proc.pid).children(recursive=True)
                if f"/{model}/1/model.py" in " ".join(p.cmdline()))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_tritonserver_and_its_model_processes_start_on_the_cpus_left_to_them(fake):
    """ServerOptions.cpus (the CPUs engine_cpus leaves, backend/serving/cpu_placement.py): the server and every
    process it starts run there; this process keeps its own."""
    mine = os.sched_getaffinity(0)
    rest = frozenset({min(mine)})
    supervisor, _ = fake(cpus=rest)
    server = psutil.Process(supervisor.proc.pid)
    processes = [server, *server.children(recursive=True)]
    assert len(processes) >= 3  # the wrapper's server and its two model processes
    assert all(set(p.cpu_affinity()) == rest for p in processes)
    assert os.sched_getaffinity(0) == mine


def test_a_dead_model_process_restarts_the_server(fake):
    supervisor, result = fake(max_restarts=2)
    health = f"http://localhost:{supervisor.sup.health_port}/v2/health"
    assert get_status(f"{health}/ready") == 200 and get_status(f"{health}/live") == 200
    first = psutil.Process(supervisor.proc.pid)
    regions = [Path("/dev/shm", p.cmdline()[2]) for p in first.children()]
    assert len(regions) == 2 and all(r.exists() for r in regions)
    dead = _stub(supervisor, "postprocessing")
    dead.kill()
    assert wait_for(lambda: supervisor.state != "serving", 5)
    assert wait_for(lambda: supervisor.state == "serving" and supervisor.proc.pid != first.pid, 30)
    assert not alive(first)
    assert not any(r.exists() for r in regions)  # the killed server's shared memory is not left behind
    assert not alive(dead)
    assert get_status(f"{health}/ready") == 200
    supervisor.on_signal(signal.SIGTERM)
    assert wait_for(lambda: "rc" in result, 30) and result["rc"] == EXIT_OK
    assert supervisor.state == "stopped"


def test_restart_budget_spent_exits_failed_with_nothing_left(fake):
    supervisor, result = fake(max_restarts=0)
    server = psutil.Process(supervisor.proc.pid)
    stubs = server.children()
    _stub(supervisor, "tensorrt_llm").kill()
    assert wait_for(lambda: "rc" in result, 30) and result["rc"] == EXIT_FAILED
    assert supervisor.state == "failed" and "tensorrt_llm v1 model process" in supervisor.reason
    assert not alive(server) and not any(alive(s) for s in stubs)


def _sigterm_with_two_in_flight(supervisor: Supervisor) -> float:
    """SIGTERM while a model process reports two requests in flight, which then sees "draining" (refuses from now
    on); the monotonic time of the signal."""
    supervisor.control.report_inflight("tensorrt_llm", 2)  # as a model process with two requests in flight would
    started = time.monotonic()
    supervisor.on_signal(signal.SIGTERM)
    assert wait_for(lambda: supervisor.control.phase().phase == "draining", 5)
    supervisor.control.report_inflight("tensorrt_llm", 2, "draining")
    return started


def test_sigterm_drains_in_flight_then_stops(fake):
    """Readiness is 503 for as long as requests drain (a long grace: no race with its end); the last one ending
    stops the server at once, well inside the grace period."""
    supervisor, result = fake(shutdown_grace_s=60)
    server, stubs = psutil.Process(supervisor.proc.pid), psutil.Process(supervisor.proc.pid).children()
    started = _sigterm_with_two_in_flight(supervisor)
    ready = f"http://localhost:{supervisor.sup.health_port}/v2/health/ready"
    assert wait_for(lambda: get_status(ready) == 503, 10)
    assert supervisor.state == "draining" and "rc" not in result
    supervisor.control.report_inflight("tensorrt_llm", 0, "draining")  # the last request finished
    assert wait_for(lambda: "rc" in result, 30) and result["rc"] == EXIT_OK
    assert time.monotonic() - started < 60  # stopped when nothing was left, not at the grace period's end
    assert not alive(server) and not any(alive(s) for s in stubs)


def test_sigterm_waits_out_the_grace_period_then_stops(fake):
    supervisor, result = fake(shutdown_grace_s=0.5)
    server, stubs = psutil.Process(supervisor.proc.pid), psutil.Process(supervisor.proc.pid).children()
    started = _sigterm_with_two_in_flight(supervisor)
    assert wait_for(lambda: "rc" in result, 30) and result["rc"] == EXIT_OK
    assert time.monotonic() - started >= 0.5  # the grace period was waited out (the count never dropped)
    assert not alive(server) and not any(alive(s) for s in stubs)


def test_stub_watch_ignores_a_model_process_that_triton_reaped(tmp_path):
    """A stub that exits and is reaped (Triton unloading a model) is no fault; one left a zombie is."""
    parent = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watch = StubWatch(parent.pid)
        assert watch.dead() == []
    finally:
        parent.kill()
        parent.wait()
    assert StubWatch(os.getpid()).dead() == []


def test_health_server_answers_503_with_the_state(tmp_path):
    port = free_ports(1)[0]
    health = HealthServer("127.0.0.1", port, lambda: ("draining", "shutting down on SIGTERM"), "localhost:1")
    try:
        assert get_status(f"http://localhost:{port}/v2/health/ready") == 503
        assert get_status(f"http://localhost:{port}/v2/health/live") == 200
        assert get_status(f"http://localhost:{port}/other") == 404
    finally:
        health.close()


def test_options_are_validated():
    with pytest.raises(ValueError, match="shutdown_grace_s must be > 0"):
        SupervisorOptions(shutdown_grace_s=0)
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        SupervisorOptions(max_restarts=-1)
    assert ServerPhase("aborting", "x").admitting is False


def test_a_taken_health_port_is_refused_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        supervisor = Supervisor(ServerOptions(tmp_path, *free_ports(3)),
                                SupervisorOptions(health_port=taken.getsockname()[1]),
                                TritonInstall(binary=Path("/bin/false"), backend_dir=None))
        assert supervisor.run() == EXIT_FAILED
    assert "cannot be bound" in supervisor.reason and supervisor.proc is None


def _health_stub(answers: dict) -> http.server.ThreadingHTTPServer:
    """A stand-in for Triton's health route: answers["delay_s"] late, then per answers["mode"]: 'ok' (200),
    'unready' (400) or 'reset' (the connection closed without an answer)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            time.sleep(answers.get("delay_s", 0.0))
            if answers["mode"] == "reset":
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(200 if answers["mode"] == "ok" else 400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_triton_watch_tolerates_a_slow_answer_but_not_a_refusal():
    """A busy machine's slow health answer does not flap readiness; a server that is gone counts at once."""
    answers = {"mode": "ok", "delay_s": 0.0}
    httpd = _health_stub(answers)
    watch = TritonWatch(f"127.0.0.1:{httpd.server_port}", period_s=0.05, timeout_s=0.2)
    try:
        assert wait_for(lambda: watch.ready, 5)
        answers["delay_s"] = 0.3  # one or two slow answers: still ready
        time.sleep(0.5)
        assert watch.ready
        assert wait_for(lambda: not watch.ready, 5)  # three slow answers in a row: not ready
        answers["delay_s"] = 0.0
        assert wait_for(lambda: watch.ready, 5)
        httpd.shutdown()
        httpd.server_close()
        assert wait_for(lambda: not watch.ready, 1)  # refused: at once
    finally:
        watch.close()


def test_triton_watch_tolerates_one_reset_or_error_answer_and_logs_changes():
    """A reset connection or a 400 once is a doubt, not a verdict (the fresh-clone CI run's 0.3 s flap); three in a
    row turn readiness false, and each change is logged with its reason."""
    answers = {"mode": "ok"}
    httpd = _health_stub(answers)
    lines: list[str] = []
    watch = TritonWatch(f"127.0.0.1:{httpd.server_port}", period_s=0.05, timeout_s=0.5, log=lines.append)
    try:
        assert wait_for(lambda: watch.ready, 5)
        for mode in ("reset", "unready"):
            answers["mode"] = mode
            time.sleep(0.07)  # about one poll
            answers["mode"] = "ok"
            time.sleep(0.15)
            assert watch.ready, (mode, lines)
        answers["mode"] = "unready"
        assert wait_for(lambda: not watch.ready, 5)
        answers["mode"] = "ok"
        assert wait_for(lambda: watch.ready, 5)
    finally:
        watch.close()
        httpd.shutdown()
        httpd.server_close()
    assert lines[0] == "tritonserver health ready" and "not ready (doubtful: HTTP 400)" in lines[-2], lines
