"""`python -m ensembles serve` runs tritonserver as its child and keeps it honest (docs/operations.md):

- a model process (Python-backend stub) that dies: Triton 2.51 neither notices nor restarts it (ensembles/stub_watch.py),
  so the launcher does: live models fail their in-flight requests with UNAVAILABLE and the reason, tritonserver's
  process group is killed (the dead model's own streams end with a dropped connection at once) and a new server is
  started; readiness is false from the death until the new server is ready. More than `max_restarts` faults within
  `restart_window_s`, or a server that never became ready: exit EXIT_FAILED for the service manager to act on.
- SIGTERM / SIGINT: stop admitting (the models refuse new requests with UNAVAILABLE, readiness turns false), let
  in-flight requests finish for up to `shutdown_grace_s`, fail the rest with UNAVAILABLE ("the grace period ended"),
  then stop the front and tritonserver (each SIGKILLed after `stop_timeout_s`; SIGINT first for tritonserver) and
  exit 0 with no model process left. A second signal skips the rest of the grace period.
- The front (frontend/, the public HTTP port and the OpenAI API) runs beside tritonserver as a second child: it
  answers 503 for Triton's routes while tritonserver restarts; a front that exits is a fault like a dead model
  process (both are restarted); on SIGTERM it is stopped before tritonserver, once in-flight requests have drained
  (its keep-alive connections to Triton's HTTP port would hold Triton's stop for its whole exit timeout).
The launcher and the models talk through backend/serving/lifecycle.py's control folder.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from backend.serving.lifecycle import CONTROL_DIR_ENV, ControlDir, ServerPhase
from ensembles.health import HealthServer, triton_ready
from ensembles.server import ServerOptions, TritonInstall, find_tritonserver, launch, server_env
from ensembles.stack import FrontProcess
from ensembles.stub_watch import StubWatch

EXIT_OK = 0
EXIT_FAILED = 3  # tritonserver could not be started, or kept failing (restart budget spent)
ACK_TIMEOUT_S = 2.0  # for the models to see "draining" before readiness turns false (they poll every 0.1 s)
ABORT_SETTLE_S = 1.0  # after failing in-flight requests, before the kill: time for the errors to reach clients


@dataclass(frozen=True)
class SupervisorOptions:
    shutdown_grace_s: float = 30.0
    stop_timeout_s: float = 5.0  # tritonserver's own stop (nothing is in flight by then), before SIGKILL
    max_restarts: int = 3  # within restart_window_s; 0: exit EXIT_FAILED at the first fault
    restart_window_s: float = 600.0
    poll_s: float = 0.5
    ready_timeout_s: float = 600.0
    health_host: str = "0.0.0.0"
    health_port: int | None = None  # None: no health endpoint of the launcher's own

    def __post_init__(self) -> None:
        for name in ("shutdown_grace_s", "stop_timeout_s", "restart_window_s", "poll_s", "ready_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")


def _say(message: str) -> None:
    print(f"tritonllm: {message}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, opts: ServerOptions, sup: SupervisorOptions, install: TritonInstall | None = None,
                 front: FrontProcess | None = None) -> None:
        self.opts = opts
        self.front = front
        self.sup = sup
        self.install = install or find_tritonserver()
        self.control = ControlDir(tempfile.mkdtemp(prefix="tritonllm-control-"))
        self.proc: subprocess.Popen | None = None
        self.watch: StubWatch | None = None
        self.state, self.reason = "starting", "tritonserver is loading its models"
        self.faults: list[float] = []
        self.signals: list[str] = []
        self._wake = threading.Event()

    # -- signals and state ------------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame=None) -> None:
        self.signals.append(signal.Signals(signum).name)
        self._wake.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def current(self) -> tuple[str, str]:
        if self.state == "serving" and self.front is not None and self.front.exited() is not None:
            return "restarting", f"the front exited with code {self.front.exited()}"
        return self.state, self.reason

    def _set(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        _say(f"{state}: {reason}")

    # -- the main loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        health = None
        try:
            if self.sup.health_port is not None:
                health = HealthServer(self.sup.health_host, self.sup.health_port, self.current,
                                      f"127.0.0.1:{self.opts.http_port}", log=_say)
        except OSError as exc:
            self._set("failed", f"the health port {self.sup.health_port} cannot be bound ({exc}): --health-port")
            shutil.rmtree(self.control.path, ignore_errors=True)
            return EXIT_FAILED
        try:
            return self._serve()
        finally:
            self._kill()
            if self.front is not None:
                self.front.stop(self.sup.stop_timeout_s)
            if health is not None:
                health.close()
            shutil.rmtree(self.control.path, ignore_errors=True)

    def _serve(self) -> int:
        started = False
        while True:
            if self._start():
                started = True
                fault = self._watch()
                if fault is None:
                    return self._shutdown()
                restart = self._may_restart()
                self._set("restarting" if restart else "stopping", fault)
                self._abort_inflight(f"the server is {'restarting' if restart else 'stopping'}: {fault}")
            elif self.signals:
                self._set("stopped", f"{self.signals[0]} while starting")
                return EXIT_OK
            elif not started and not self._crashed():  # a configuration that never served: a retry would not help
                self._set("failed", self.reason)
                return EXIT_FAILED
            else:
                fault, restart = self.reason, self._may_restart()
                self._set("restarting" if restart else "stopping", fault)
            self._kill()
            if not restart:
                self._set("failed", f"{fault}; {len(self.faults)} faults within {self.sup.restart_window_s:g} s "
                                    f"(max_restarts {self.sup.max_restarts})")
                return EXIT_FAILED

    def _start(self) -> bool:
        if self.front is not None and (self.front.proc is None or self.front.exited() is not None):
            self.front.start()  # at once: it answers 503 for Triton's routes until tritonserver is ready
        self.control.set_phase(ServerPhase("serving"))
        self.control.clear_inflight()
        env = {**server_env(self.install), CONTROL_DIR_ENV: str(self.control.path)}
        self.proc = launch(self.install, self.opts, env)
        self._set("starting", f"tritonserver (pid {self.proc.pid}) is loading its models")
        deadline = time.monotonic() + self.sup.ready_timeout_s
        while time.monotonic() < deadline and not self.signals:
            if self.proc.poll() is not None:
                self.reason = f"tritonserver exited with code {self.proc.returncode} before it was ready"
                return False
            if triton_ready(f"127.0.0.1:{self.opts.http_port}"):
                self.watch = StubWatch(self.proc.pid)
                self._set("serving", f"tritonserver (pid {self.proc.pid}) is ready")
                return True
            self._wake.wait(self.sup.poll_s)
        self.reason = f"tritonserver not ready after {self.sup.ready_timeout_s:g} s"
        return False

    def _watch(self) -> str | None:
        """Wait for a fault (its description) or a shutdown signal (None)."""
        while True:
            self._wake.wait(self.sup.poll_s)
            if self.signals:
                return None
            if self.proc.poll() is not None:
                return f"tritonserver exited with code {self.proc.returncode}"
            if self.front is not None and self.front.exited() is not None:
                return f"the front exited with code {self.front.exited()}"
            dead = self.watch.dead()
            if dead:
                return "; ".join(dead)

    def _crashed(self) -> bool:
        """Killed by a signal while starting (measured: a boost::interprocess::lock_exception abort in the Python
        backend under heavy load), as opposed to exiting because the repository cannot be served."""
        return self.proc is not None and self.proc.returncode is not None and self.proc.returncode < 0

    def _may_restart(self) -> bool:
        now = time.monotonic()
        self.faults = [t for t in self.faults if now - t < self.sup.restart_window_s] + [now]
        return len(self.faults) <= self.sup.max_restarts

    # -- draining and stopping --------------------------------------------------------------------------------
    def _inflight(self) -> int:
        return self.control.inflight(self.watch.alive if self.watch else lambda _pid: False)

    def _wait_inflight(self, timeout_s: float, second_signal_ends: bool = False) -> int:
        """Wait until nothing is in flight (0) or timeout_s passed (what is left)."""
        deadline = time.monotonic() + timeout_s
        while (left := self._inflight()) and time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None or (second_signal_ends and len(self.signals) > 1):
                return left
            time.sleep(0.1)
        return left

    def _wait_acknowledged(self, phase: str, timeout_s: float) -> bool:
        """Until every live model process has seen `phase` (True) or timeout_s passed (False)."""
        alive = self.watch.alive if self.watch else lambda _pid: False
        deadline = time.monotonic() + timeout_s
        while not self.control.acknowledged(phase, alive):
            if time.monotonic() > deadline or self.proc is None or self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return True

    def _abort_inflight(self, reason: str) -> None:
        """Live models fail what they hold with UNAVAILABLE and `reason` (a dead model's requests cannot be)."""
        self.control.set_phase(ServerPhase("aborting", reason))
        if self._wait_inflight(ABORT_SETTLE_S) == 0:
            time.sleep(0.2)  # the error responses are on their way through the ensemble to the clients

    def _shutdown(self) -> int:
        why = f"shutting down on {self.signals[0]}"
        grace = self.sup.shutdown_grace_s
        # The models first, then readiness: once a probe sees "draining", no model admits a new request.
        self.control.set_phase(ServerPhase("draining", why))
        began = time.monotonic()
        seen = self._wait_acknowledged("draining", ACK_TIMEOUT_S)
        _say(f"every model process saw draining after {time.monotonic() - began:.2f} s" if seen else
             f"not every model process saw draining within {ACK_TIMEOUT_S:g} s: readiness turns false anyway")
        self._set("draining", f"{why}: in-flight requests have {grace:g} s to finish")
        left = self._wait_inflight(grace, second_signal_ends=True)
        if left:
            _say(f"{left} requests still in flight after the grace period: failing them")
            self._abort_inflight(f"the server shut down ({why}): the {grace:g} s shutdown grace period ended "
                                 "before this request finished")
        # The front next, nothing being in flight: its keep-alive connections to Triton's HTTP port would hold
        # Triton's own stop ("Found 1 HTTP service connections") until stop_timeout_s kills it.
        if self.front is not None:
            self.front.stop(self.sup.stop_timeout_s)
        self._stop_triton()
        self._set("stopped", why)
        return EXIT_OK

    def _stop_triton(self) -> None:
        """Triton's own stop (nothing is in flight any more), bounded; then nothing of it is left."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(self.sup.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _say(f"tritonserver did not stop within {self.sup.stop_timeout_s:g} s: killing it")
        self._kill()

    def _kill(self) -> None:
        """SIGKILL tritonserver's process group: the server and every model process it started."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.watch is not None:
            self.watch.remove_shm_regions()
        self.proc, self.watch = None, None
