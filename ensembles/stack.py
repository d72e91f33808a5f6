"""The serving stack: tritonserver plus the front (frontend/), started and stopped together.

Ports (defaults; docs/front.md):
    8000  public HTTP, the front's KServe v2 proxy (bounded, validated bodies) -> Triton HTTP on 127.0.0.1:8003
    8001  public gRPC, Triton itself (protobuf: no JSON parser involved)
    8002  public metrics, Triton itself (Prometheus text)
    9000  public HTTP, the front's OpenAI-compatible API -> Triton gRPC (127.0.0.1:8001)
Triton's own HTTP listens on loopback only: no request reaches its JSON parser without passing the front.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ensembles.server import ServerOptions, TritonServer

LOOPBACK = "127.0.0.1"
DEFAULT_TRITON_HTTP_PORT = 8003


@dataclass(frozen=True)
class FrontOptions:
    http_port: int = 8000  # public KServe v2 HTTP (the front's proxy)
    openai_port: int | None = 9000  # None: no OpenAI API
    host: str = "0.0.0.0"
    tokenizer_dir: Path | None = None  # for chat templates; None: chat requests are refused (400)
    chat_template: Path | None = None  # overrides the tokenizer's own
    limits_file: Path | None = None  # tenants' API keys (hashed) live here
    served_model_name: str | None = None  # the OpenAI model id; default: the Triton model name
    tenant_header: str = "x-tenant-id"
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ports = [p for p in (self.http_port, self.openai_port) if p is not None]
        if not all(0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
            raise ValueError(f"front ports must be distinct, in 1..65535, got {ports}")


def front_command(front: FrontOptions, triton: ServerOptions) -> list[str]:
    cmd = [sys.executable, "-m", "frontend", "--host", front.host, "--http-port", str(front.http_port),
           "--openai-port", str(front.openai_port or 0),
           "--triton-http-url", f"http://{LOOPBACK}:{triton.http_port}",
           "--triton-grpc-url", f"{LOOPBACK}:{triton.grpc_port}", "--tenant-header", front.tenant_header]
    for flag, value in (("--tokenizer-dir", front.tokenizer_dir), ("--chat-template", front.chat_template),
                        ("--limits-file", front.limits_file), ("--served-model-name", front.served_model_name)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + list(front.extra_args)


class FrontProcess:
    """The front as a child process (its own session: a terminal's Ctrl-C reaches only the launcher, which stops
    the front once tritonserver has drained, before stopping it). It answers 503 for Triton's routes while Triton
    is down."""

    def __init__(self, front: FrontOptions, triton: ServerOptions, log: Path | None = None) -> None:
        self.opts, self.triton, self.log = front, triton, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else None
        self.proc = subprocess.Popen(front_command(self.opts, self.triton), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=_term_with_parent)

    def exited(self) -> int | None:
        """The exit code once it has exited (None while it runs or before start)."""
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        urls = [f"http://{LOOPBACK}:{self.opts.http_port}/v2/health/ready"]
        if self.opts.openai_port:
            urls.append(f"http://{LOOPBACK}:{self.opts.openai_port}/health")
        while not all(_status(u) == 200 for u in urls):
            if self.exited() is not None:
                raise RuntimeError(f"the front exited with code {self.proc.returncode}; log: {self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the front was not ready after {timeout_s}s; log: {self.log}")
            time.sleep(0.3)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (uvicorn finishes its open responses), SIGKILL of its group after timeout_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ServingStack:
    """tritonserver (HTTP on loopback) and the front, as one unit for tests and benchmarks (`python -m ensembles
    serve` runs the same two under ensembles/supervisor.py). `http_url` is the public (front) HTTP address, as
    TritonServer's is for Triton alone."""

    def __init__(self, opts: ServerOptions, front: FrontOptions, log_dir: Path | None = None) -> None:
        self.opts = dataclasses.replace(opts, http_address=LOOPBACK)
        self.front_opts = front
        self.log_dir = Path(log_dir) if log_dir else None
        self.triton = TritonServer(self.opts, log_path=self._log("tritonserver.log"))
        self.front = FrontProcess(front, self.opts, self._log("front.log"))

    def _log(self, name: str) -> Path | None:
        return self.log_dir / name if self.log_dir else None

    @property
    def http_url(self) -> str:
        return f"{LOOPBACK}:{self.front_opts.http_port}"

    @property
    def grpc_url(self) -> str:
        return self.triton.grpc_url

    @property
    def openai_url(self) -> str:
        return f"http://{LOOPBACK}:{self.front_opts.openai_port}/v1"

    def start(self, ready_timeout_s: float = 300.0, models: tuple[str, ...] = ()) -> "ServingStack":
        self.triton.start(ready_timeout_s, models)
        try:
            self.front.start()
            self.front.wait_ready()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """The front first (it drains its in-flight requests), then tritonserver."""
        self.front.stop(timeout_s)
        self.triton.stop(timeout_s)

    def __enter__(self) -> "ServingStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


PR_SET_PDEATHSIG = 1  # prctl(2)


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (even by SIGKILL), so a killed
    launcher or test leaves no front behind holding the public ports."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError as exc:
        return getattr(exc, "code", 0) or 0
