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
    return triton_probe(http_url, timeout_s)[0] == "ready"


def triton_probe(http_url: str, timeout_s: float) -> tuple[str, str]:
    """(outcome, detail): outcome 'ready', 'refused' (nothing listens: the server is gone) or 'doubtful' (a slow
    answer, a reset connection, an answer other than 200: a busy or stopping server, not yet a dead one)."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=timeout_s) as resp:
            return ("ready", "200") if resp.status == 200 else ("doubtful", f"HTTP {resp.status}")
    except urllib.error.HTTPError as exc:
        return "doubtful", f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        return ("refused" if refused else "doubtful"), str(exc.reason)
    except OSError as exc:  # TimeoutError, ConnectionResetError, RemoteDisconnected
        return "doubtful", f"{type(exc).__name__}: {exc}"


class TritonWatch:
    """Triton's readiness polled in the background, so a probe is answered at once from the last result (an
    orchestrator's probe times out after 1 s by default). A refused connection counts at once; any other doubt
    (slow, reset, not 200) only after DOUBT_LIMIT in a row. Measured: under a load average of 10 Triton's health
    route sometimes took over a second, and in a fresh-clone CI run one doubtful poll turned readiness false for
    0.3 s while every request was served and Triton answered 200 through the front. Stopping and restarting are
    the supervisor's own states, so tolerating a doubt never hides them. Each change is logged with its reason."""

    DOUBT_LIMIT = 3

    def __init__(self, http_url: str, period_s: float = 0.5, timeout_s: float = 2.0,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.http_url, self.period_s, self.timeout_s, self.log = http_url, period_s, timeout_s, log
        self.ready, self._doubts = False, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonllm-triton-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record(*triton_probe(self.http_url, self.timeout_s))
            self._stop.wait(self.period_s)

    def _record(self, outcome: str, detail: str) -> None:
        self._doubts = self._doubts + 1 if outcome == "doubtful" else 0
        if outcome == "doubtful" and self._doubts < self.DOUBT_LIMIT:
            return
        ready = outcome == "ready"
        if ready != self.ready:
            self.log(f"tritonserver health {'ready' if ready else f'not ready ({outcome}: {detail})'}")
        self.ready = ready

    def close(self) -> None:
        self._stop.set()


class HealthServer:
    """Serves state() -> (state, reason) on a daemon thread; readiness also needs TritonWatch's last answer."""

    def __init__(self, host: str, port: int, state: Callable[[], tuple[str, str]], triton_url: str,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.state = state
        self.triton_url = triton_url
        self.triton = TritonWatch(triton_url, log=log)
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="tritonllm-health", daemon=True)
        self._thread.start()

    def ready(self) -> tuple[bool, dict]:
        state, reason = self.state()
        # The watch lags the first ready answer by up to one period: ask Triton itself then (briefly).
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
