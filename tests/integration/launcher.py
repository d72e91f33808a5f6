"""`python -m ensembles serve` as a test's child process, and the processes it started.

The fault tests signal and kill only what this helper started: the launcher (its pid), the tritonserver it runs
(a child of the launcher) and that server's model processes (triton_python_backend_stub children of it, found by
the model folder in their command line). teardown() kills whatever of them is left, by those pids and groups.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from ensembles.server import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]


def get_status(url: str, timeout_s: float = 2.0) -> int:
    """HTTP status of a GET, 0 when nothing answers (refused, reset, timed out)."""
    try:
        return requests.get(url, timeout=timeout_s).status_code
    except requests.RequestException:
        return 0


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a dead child not reaped yet counts as gone)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for(predicate, timeout_s: float, period_s: float = 0.2):
    """Poll until predicate() is truthy (returned) or timeout_s passed (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(period_s)
    return None


@dataclass
class Launcher:
    repo: Path
    log_path: Path
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None  # instead of `python -m ensembles serve --model-repository ...`
    proc: subprocess.Popen | None = None
    # http (the front), grpc, metrics, health, Triton's own (loopback) http, openai
    ports: list[int] = field(default_factory=lambda: free_ports(6))
    servers_seen: set[int] = field(default_factory=set)

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.ports[1]}"

    @property
    def http_url(self) -> str:
        return f"localhost:{self.ports[0]}"

    def start(self, ready_timeout_s: float = 300.0) -> "Launcher":
        http, grpc, metrics, health, triton_http, _openai = self.ports
        cmd = list(self.command) if self.command else [
            sys.executable, "-m", "ensembles", "serve", "--model-repository", str(self.repo), "--http-port",
            str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--health-port", str(health),
            "--triton-http-port", str(triton_http), "--no-openai", "--admin-key", "test-admin", *self.extra_args]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        # Ready = what a load balancer waits for: the launcher's readiness, and Triton's through the front. The
        # launcher turns ready at its next poll after Triton does (a fresh-clone CI run sampled 0.3 s between).
        if not wait_for(lambda: self.ready() or self.proc.poll() is not None, ready_timeout_s, 0.1) \
                or self.proc.poll() is not None:
            raise RuntimeError(f"the launcher did not get ready; log: {self.log_path.read_text()[-3000:]}")
        return self

    def ready(self) -> bool:
        return self.health_ready() == 200 and self.triton_ready() == 200

    def triton_ready(self) -> int:
        """Triton's /v2/health/ready through the front (503 from the front while tritonserver is down)."""
        return get_status(f"http://{self.http_url}/v2/health/ready")

    def health_ready(self) -> int:
        """The launcher's own readiness endpoint."""
        return get_status(f"http://localhost:{self.ports[3]}/v2/health/ready")

    def server(self) -> psutil.Process | None:
        """The tritonserver this launcher runs now (the launcher itself where it execs tritonserver)."""
        try:
            launcher = psutil.Process(self.proc.pid)
            candidates = [launcher] + launcher.children(recursive=True)
            found = next((p for p in candidates if p.name() == "tritonserver"), None)
        except psutil.Error:
            return None
        if found is not None:
            self.servers_seen.add(found.pid)
        return found

    def stub(self, model: str) -> psutil.Process:
        """The model process (Python-backend stub) of `model` under the current tritonserver."""
        server = self.server()
        assert server is not None, "no tritonserver running"
        for child in server.children():
            if f"/{model}/1/model.py" in " ".join(child.cmdline()):
                return child
        raise AssertionError(f"no stub of {model} under tritonserver {server.pid}")

    def stubs(self) -> list[psutil.Process]:
        server = self.server()
        return server.children() if server else []

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def teardown(self) -> None:
        """Kill what is left of what this launcher started (its group, and each tritonserver group it ran)."""
        if self.proc.poll() is None:
            self.server()  # the one running now (a restarted server is not seen otherwise)
        for pgid in [self.proc.pid] + sorted(self.servers_seen):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait(30)
