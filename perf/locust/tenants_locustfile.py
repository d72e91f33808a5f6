"""Bounded load on loopback for two tenants, one over its rate limit: refusals must show up for that tenant only.

HTTP users on /v2/models/ensemble/generate. Each tenant authenticates with its API key, sent as an `authorization`
field of the JSON body ("Bearer <key>"): Triton 2.51 forwards headers as request parameters for gRPC and /infer,
not for /generate, whose extra body fields become the parameters. A refusal (the server's "request refused" error
with retry_after_ms) is recorded as a failure under the tenant's own request name, so locust's stats and failures
CSVs split by tenant. Tenants: TENANT_OK (default locust-ok, key $TENANT_OK_KEY) and TENANT_OVER (default
locust-over, key $TENANT_OVER_KEY), which the limits file must name with those keys' digests
(tests/integration/test_tenants.py uses 1 request/s, burst 2 for locust-over; `python -m ensembles keys new`).

    TENANT_OK_KEY=... TENANT_OVER_KEY=... .venv/bin/python -m locust -f perf/locust/tenants_locustfile.py --headless -u 4 -r 4 -t 20s \\
        --host http://localhost:8000 --csv build/locust/tenants --only-summary
"""
from __future__ import annotations

import os

from locust import HttpUser, constant, task

PROMPT = "def fibonacci(n):\n"
MAX_TOKENS = int(os.environ.get("LOCUST_MAX_TOKENS", "8"))


class _Tenant(HttpUser):
    abstract = True
    tenant = "default"
    api_key = ""

    @task
    def generate(self) -> None:
        body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "authorization": f"Bearer {self.api_key}"}
        with self.client.post("/v2/models/ensemble/generate", json=body, name=f"generate [{self.tenant}]",
                              catch_response=True) as resp:
            if resp.status_code == 200:
                resp.success()
            elif "request refused" in resp.text:
                resp.failure(f"refused: {_limit(resp.text)}")
            else:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")


def _limit(text: str) -> str:
    """The limit a refusal names ('requests_per_s', ...), so failures group by reason, not by retry hint."""
    marker = "(limit "
    return text[text.index(marker) + len(marker):].split(")", 1)[0] if marker in text else "unknown"


class InLimitTenant(_Tenant):
    """Well under its limits: one request at a time with a pause."""

    tenant = os.environ.get("TENANT_OK", "locust-ok")
    api_key = os.environ.get("TENANT_OK_KEY", "")
    fixed_count = 2
    wait_time = constant(0.5)


class OverLimitTenant(_Tenant):
    """Back-to-back requests: far over a 1 request/s limit."""

    tenant = os.environ.get("TENANT_OVER", "locust-over")
    api_key = os.environ.get("TENANT_OVER_KEY", "")
    fixed_count = 2
    wait_time = constant(0.05)
