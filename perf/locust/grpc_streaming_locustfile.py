"""Users that stream from the ensemble over gRPC (Triton's bidirectional stream, as tritonclient's start_stream /
async_stream_infer do) and record, per request, custom locust events besides the request itself:

| request_type | name | "response time" column holds |
|---|---|---|
| GRPC_STREAM | ensemble | whole request, send to final response (ms); failures (errors, timeouts) go here |
| TTFT | ensemble | time to first token: send to the first non-empty text chunk (ms) |
| ITL | ensemble | mean inter-token latency: (last chunk - first chunk) / (output tokens - 1) (ms) |
| TOKENS_PER_S | ensemble | this request's output tokens / its whole time (tokens/s, not ms) |

Locust's stats CSV / HTML report then give each one's median, percentiles and count. Output tokens are the
server's count (return_num_output_tokens: each streamed chunk counts its own tokens, summed here). Bounded and headless, it stops by itself:

    .venv/bin/python -m locust -f perf/locust/grpc_streaming_locustfile.py --headless -u 4 -r 2 -t 30s \\
        --host localhost:8001 --csv build/locust/grpc --html build/locust/grpc.html --only-summary

Environment: LOCUST_MAX_TOKENS (default 32), LOCUST_MIN_TOKENS (default = max tokens: fixed-length outputs),
LOCUST_TIMEOUT_S (default 120). --host is the gRPC address host:port (a grpc:// prefix is accepted).
"""
from __future__ import annotations

import itertools
import os
import time

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # grpcio's blocking calls must yield to locust's gevent loop (before any channel exists)

from locust import User, between, events, task  # noqa: E402

from client.errors import GenerationError  # noqa: E402
from client.grpc_client import GrpcLLMClient  # noqa: E402
from client.request import GenerationRequest  # noqa: E402

MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "32"))
MIN_TOKENS = int(os.environ.get("LOCUST_MIN_TOKENS", str(MAX_TOKENS)))
TIMEOUT_S = float(os.environ.get("LOCUST_TIMEOUT_S", "120"))
PROMPTS = ["def fibonacci(n):\n", "class LRUCache:\n    def __init__(self, capacity):\n",
           "import os\n\n\ndef main():\n", "def merge_sort(items):\n", "with open(filename) as f:\n",
           "if __name__ == '__main__':\n"]
_prompts = itertools.cycle(PROMPTS)


@events.init_command_line_parser.add_listener
def _check_limits(parser) -> None:
    if MAX_TOKENS < 1 or not 0 <= MIN_TOKENS <= MAX_TOKENS:
        raise SystemExit(f"LOCUST_MAX_TOKENS must be >= 1 and LOCUST_MIN_TOKENS in [0, max], "
                         f"got {MAX_TOKENS} and {MIN_TOKENS}")


class GrpcStreamingUser(User):
    """One request at a time, streamed; a short pause between requests."""

    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        url = (self.host or "localhost:8001").removeprefix("grpc://")
        self.client = GrpcLLMClient(url, model="ensemble", timeout_s=TIMEOUT_S)

    @task
    def stream(self) -> None:
        req = GenerationRequest(next(_prompts), max_tokens=MAX_TOKENS, stream=True, min_tokens=MIN_TOKENS or None,
                                return_num_output_tokens=True)
        start = time.perf_counter()
        chunk_times, tokens, error = [], 0, None
        try:
            for chunk in self.client.generate(req):
                if chunk.text:
                    chunk_times.append(time.perf_counter())
                tokens += chunk.num_output_tokens or 0
        except GenerationError as e:
            error = e
        total = time.perf_counter() - start
        self._fire("GRPC_STREAM", total * 1e3, tokens, error)
        if error is not None or not chunk_times:
            return
        self._fire("TTFT", (chunk_times[0] - start) * 1e3, tokens)
        if tokens > 1:
            self._fire("ITL", (chunk_times[-1] - chunk_times[0]) * 1e3 / (tokens - 1), tokens)
        self._fire("TOKENS_PER_S", tokens / total, tokens)

    def _fire(self, kind: str, value: float, tokens: int, error: Exception | None = None) -> None:
        self.environment.events.request.fire(request_type=kind, name="ensemble", response_time=value,
                                             response_length=tokens, exception=error, context={})
