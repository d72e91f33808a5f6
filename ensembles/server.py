"""Find a tritonserver (one on PATH, as in NVIDIA's containers, else the one inside the nvidia-pytriton wheel)
and run it over a model repository."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backend.policy.api_keys import AUTHORIZATION, FRONT_KEY
from ensembles.render import REPO_ROOT


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None  # None: the server's own default (/opt/tritonserver/backends)
    env: dict[str, str] = field(default_factory=dict)  # extra environment the binary needs


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    # Where Triton's HTTP binds. The launcher binds it to loopback: the public HTTP surface is the front
    # (frontend/, ensembles/stack.py), which bounds and validates bodies before Triton parses them.
    http_address: str = "0.0.0.0"
    # Secure defaults (the CLI always sets admin_key): model-repository control, shared memory, trace and logging
    # settings need this key in the ADMIN_HEADER header. None: unrestricted (tests that drive these APIs).
    admin_key: str | None = None
    # Header naming a tenant (trusted only from the front), forwarded to the models as a request parameter beside the
    # credential headers (CREDENTIAL_HEADERS); None: only those.
    tenant_header: str | None = "x-tenant-id"
    # "explicit": models are loaded/unloaded through the model-control API (canary versions); all load at start.
    model_control_mode: str = "none"
    # CPUs tritonserver (and so every model process it starts) runs on; None: the launcher's. The engine model's
    # step thread moves itself to its engine_cpus (backend/serving/cpu_placement.py).
    cpus: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and not self.cpus:
            raise ValueError("cpus must name at least one CPU for tritonserver (None: the launcher's)")
        if self.model_control_mode not in ("none", "explicit"):
            raise ValueError(f"model_control_mode must be none or explicit, got {self.model_control_mode!r}")
        ports = (self.http_port, self.grpc_port, self.metrics_port)
        if len(set(ports)) != 3 or not all(0 < p < 65536 for p in ports):
            raise ValueError(f"http, grpc and metrics ports must be three distinct ports in 1..65535, got {ports}")
        if not Path(self.model_repository).is_dir():
            raise ValueError(f"model repository {self.model_repository} does not exist")


def free_ports(n: int) -> list[int]:
    """n TCP ports free on loopback right now (bound together, so distinct), for servers of tests and benchmarks."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _libpython_dir() -> Path:
    """Folder of this interpreter's libpython: the Python backend stub embeds the same Python."""
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    for folder in (sysconfig.get_config_var("LIBDIR"), "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"):
        if folder and (Path(folder) / name).exists():
            return Path(folder)
    raise RuntimeError(
        f"{name} not found: the Python backend needs a shared libpython "
        f"(Debian: apt-get install libpython{sys.version_info.major}.{sys.version_info.minor})"
    )


def _embedded_install(cache: Path) -> TritonInstall:
    try:
        import pytriton
    except ImportError:
        raise RuntimeError(
            "no tritonserver on PATH and the nvidia-pytriton wheel is not installed: pip install 'tritonllm[server]'"
        ) from None
    pkg = Path(pytriton.__file__).parent / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pkg / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    # A backend folder of our own: the wheel's python backend plus the stub of this Python version.
    backends = cache / f"triton-backends-py{version}"
    python_backend = backends / "python"
    if not (python_backend / "triton_python_backend_stub").exists():
        tmp = backends.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(pkg / "backends" / "python", tmp / "python")
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        shutil.rmtree(backends, ignore_errors=True)
        tmp.rename(backends)
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    ld_path = [str(_libpython_dir()), str(libs)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return TritonInstall(binary=pkg / "bin" / "tritonserver", backend_dir=backends, env={"LD_LIBRARY_PATH": ":".join(ld_path)})


def find_tritonserver(cache: Path | None = None) -> TritonInstall:
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(binary=Path(on_path), backend_dir=None)
    return _embedded_install(cache or REPO_ROOT / ".cache")


def server_command(install: TritonInstall, opts: ServerOptions) -> list[str]:
    cmd = [
        str(install.binary),
        f"--model-repository={Path(opts.model_repository).resolve()}",
        f"--http-port={opts.http_port}",
        f"--http-address={opts.http_address}",
        "--metrics-address=0.0.0.0",  # Triton binds metrics where HTTP binds unless told: metrics stay public
        f"--grpc-port={opts.grpc_port}",
        f"--metrics-port={opts.metrics_port}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        f"--log-verbose={opts.log_verbose}",
        "--exit-timeout-secs=30",
        # Every config.pbtxt is rendered whole. Auto-completion would start one more Python stub per model, only to
        # ask a model.py that defines no auto_complete_config: each imports torch and transformers, ~10 s of a
        # server's start on 2 cores. NVIDIA's tensorrtllm_backend launches with the same flag.
        "--disable-auto-complete-config",
    ]
    if install.backend_dir is not None:
        cmd.append(f"--backend-directory={install.backend_dir}")
    if opts.model_control_mode == "explicit":
        cmd += ["--model-control-mode=explicit", "--load-model=*"]
    return cmd + security_args(opts) + list(opts.extra_args)


def launch(install: TritonInstall, opts: ServerOptions, env: dict[str, str], **popen) -> subprocess.Popen:
    """tritonserver as a child in a session of its own (stopped as a group), on opts.cpus when given: the processes
    it starts (every model's stub) inherit them."""
    cpus = opts.cpus
    return subprocess.Popen(server_command(install, opts), env=env, start_new_session=True,
                            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus), **popen)


ADMIN_HEADER = "x-admin-key"  # HTTP header; gRPC clients send it as GRPC_ADMIN_HEADER (Triton adds a prefix)
GRPC_ADMIN_HEADER = "triton-grpc-protocol-" + ADMIN_HEADER
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"
# Forwarded to the models as request parameters (gRPC, HTTP /infer; Triton 2.51's /generate forwards none).
CREDENTIAL_HEADERS = (AUTHORIZATION, FRONT_KEY)


def security_args(opts: ServerOptions) -> list[str]:
    """Triton 2.51's restricted-API (format `<apis>:<header>=<value>`) and header-forwarding options."""
    args = []
    if opts.admin_key:
        args += [f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={opts.admin_key}",
                 f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={opts.admin_key}"]
    # RE2, matched against the header name as sent: case-insensitive (HTTP clients write "Authorization").
    names = CREDENTIAL_HEADERS + ((opts.tenant_header,) if opts.tenant_header else ())
    pattern = f"(?i)^({'|'.join(names)})$"
    return args + [f"--grpc-header-forward-pattern={pattern}", f"--http-header-forward-pattern={pattern}"]


def server_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    env.update(install.env)
    # The Python backend stub finds its interpreter's prefix through PATH: put this (virtualenv's) python first,
    # so the stub sees the virtualenv's packages (numpy<2 among them) before anything else.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # no __pycache__ inside the model repository
    return env


class TritonServer:
    """A tritonserver child process: start, wait until ready, stop (tests, benchmarks)."""

    def __init__(self, opts: ServerOptions, install: TritonInstall | None = None, log_path: Path | None = None) -> None:
        self.opts = opts
        self.install = install or find_tritonserver()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        host = "127.0.0.1" if self.opts.http_address in ("0.0.0.0", "127.0.0.1") else self.opts.http_address
        return f"{host}:{self.opts.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.opts.grpc_port}"

    def start(self, ready_timeout_s: float = 300.0, models: tuple[str, ...] = ()) -> "TritonServer":
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = launch(self.install, self.opts, server_env(self.install), stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(ready_timeout_s, models)
        except Exception:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float, models: tuple[str, ...]) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}; log: {self.log_path}")
            if self._get("/v2/health/ready") == 200:
                failed = self._failed_models(models)
                if failed:
                    raise RuntimeError(f"models failed to load: {failed}; log: {self.log_path}")
                if all(self._get(f"/v2/models/{m}/ready") == 200 for m in models):
                    return
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s}s; log: {self.log_path}")

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=2) as resp:
                return resp.status
        except OSError:
            return 0

    def _failed_models(self, models: tuple[str, ...]) -> dict[str, str]:
        headers = {ADMIN_HEADER: self.opts.admin_key} if self.opts.admin_key else {}
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}", method="POST",
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                index = json.loads(resp.read())
        except OSError:
            return {}
        return {m["name"]: m.get("reason", "") for m in index
                if m["name"] in models and m.get("state") == "UNAVAILABLE"}

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # tritonserver drains in-flight requests, then unloads models
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
