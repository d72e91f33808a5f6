"""The launcher's own health endpoint (`--health-port`): readiness that tells the truth in every phase.

Triton's /v2/health/ready cannot be turned false while in-flight requests drain (its own shutdown path strands
decoupled ensemble streams, docs/operations.md), so the launcher answers probes itself, on the same paths:

- GET /v2/health/ready: 200 only while serving — tritonserver up and ready, no dead model process, not draining,
  not restarting; else 503 with {"state": ..., "reason": ...} (state: starting, draining, restarting, stopping,
  stopped, failed);
- GET /v2/health/live: 200 while the launcher runs and has not given up (it restarts tritonserver by itself).

Standard library only (http.server): two GET routes, no request body, nothing else exposed.
"""
from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def triton_ready(http_url: str, timeout_s: float = 1.0) -> bool:
    """Triton's own /v2/health/ready (host:port)."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False


class HealthServer:
    """Serves state() -> (state, reason) on a daemon thread; readiness also asks Triton at each probe."""

    def __init__(self, host: str, port: int, state: Callable[[], tuple[str, str]], triton_url: str) -> None:
        self.state = state
        self.triton_url = triton_url
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="tritonllm-health", daemon=True)
        self._thread.start()

    def ready(self) -> tuple[bool, dict]:
        state, reason = self.state()
        if state == "serving" and not triton_ready(self.triton_url):
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
        self.httpd.shutdown()
        self.httpd.server_close()
