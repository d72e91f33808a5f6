"""The launcher's own health endpoint (`--health-port`): readiness that tells the truth in every phase.

Triton's /v2/health/ready cannot be turned false while in-flight requests drain (its own shutdown path strands
decoupled ensemble streams, docs/operations.md), so the launcher answers probes itself, on the same paths:

- GET /v2/health/ready: 200 only while serving — tritonserver up and ready (polled every 0.5 s: TritonWatch), no
  dead model process, not draining, not restarting; else 503 with {"state": ..., "reason": ...} (state: starting, draining, restarting, stopping,
  stopped, failed);
- GET /v2/health/live: 200 while the launcher runs and has not given up (it restarts tritonserver by itself).

Standard library only (http.server): two GET routes, no request body, nothing else exposed.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def triton_ready(http_url: str, timeout_s: float = 1.0) -> bool:
    """Triton's own /v2/health/ready (host:port)."""
    return triton_probe(http_url, timeout_s) == "ready"


def triton_probe(http_url: str, timeout_s: float) -> str:
    """'ready', 'slow' (no answer within timeout_s: a busy machine, not a dead server) or 'unready' (refused,
    reset, or an answer other than 200)."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=timeout_s) as resp:
            return "ready" if resp.status == 200 else "unready"
    except TimeoutError:
        return "slow"
    except urllib.error.URLError as exc:
        return "slow" if isinstance(exc.reason, TimeoutError) else "unready"
    except OSError:
        return "unready"


class TritonWatch:
    """Triton's readiness polled in the background, so a probe is answered at once from the last result (an
    orchestrator's probe times out after 1 s by default). A refused or failed answer counts at once; a slow one
    only after SLOW_LIMIT in a row (measured: under a load average of 10 Triton's health route sometimes took over
    a second, and readiness flapped while every request was served)."""

    SLOW_LIMIT = 3

    def __init__(self, http_url: str, period_s: float = 0.5, timeout_s: float = 2.0) -> None:
        self.http_url, self.period_s, self.timeout_s = http_url, period_s, timeout_s
        self.ready, self._slow = False, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonllm-triton-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            result = triton_probe(self.http_url, self.timeout_s)
            self._slow = self._slow + 1 if result == "slow" else 0
            if result != "slow" or self._slow >= self.SLOW_LIMIT:
                self.ready = result == "ready"
            self._stop.wait(self.period_s)

    def close(self) -> None:
        self._stop.set()


class HealthServer:
    """Serves state() -> (state, reason) on a daemon thread; readiness also needs TritonWatch's last answer."""

    def __init__(self, host: str, port: int, state: Callable[[], tuple[str, str]], triton_url: str) -> None:
        self.state = state
        self.triton_url = triton_url
        self.triton = TritonWatch(triton_url)
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="tritonllm-health", daemon=True)
        self._thread.start()

    def ready(self) -> tuple[bool, dict]:
        state, reason = self.state()
        # The watch lags a transition by up to one period: ask Triton itself then (briefly).
        if state == "serving" and not (self.triton.ready or triton_ready(self.triton_url, 0.5)):
            state, reason = "starting", "tritonserver is not ready"
        return state == "serving", {"state": state, "reason": reason}

    def live(self) -> tuple[bool, dict]:
        state, reason = self.state()
        return state != "failed", {"state": state, "reason": reason}

    def _handler(self):
        routes = {"/v2/health/ready": self.ready, "/v2/health/live": self.live}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                route = routes.get(self.path.split("?", 1)[0])
                ok, body = route() if route else (False, {"error": "not found"})
                payload = json.dumps(body).encode()
                self.send_response(200 if ok else 404 if route is None else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args) -> None:  # probes every few seconds: keep the server log clean
                pass

        return Handler

    def close(self) -> None:
        self.triton.close()
        self.httpd.shutdown()
        self.httpd.server_close()
