"""Who sent a request and how long it may take: the tenant id and deadline, from Triton request parameters.

Triton 2.51 passes an ensemble request's parameters on to every composing model (verified against the embedded
server: preprocessing and tensorrt_llm both see them), and headers matching `--grpc-header-forward-pattern` arrive
as parameters too, so the tensorrt_llm model reads them directly; the ensemble's tensors are unchanged.
(HTTP /generate does not forward headers in 2.51: HTTP clients put `tenant_id` in the JSON body.)

Parameters read (request.parameters() is a JSON object):
- the tenant header (default `x-tenant-id`, forwarded by Triton) or `tenant_id`; the header wins.
- `timeout_ms` (or `timeout`, also milliseconds; gRPC clients cannot set `timeout`, tritonclient reserves it).
Nothing here is ever used as a file path. No Triton import.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from backend.errors import InvalidRequestError
from backend.policy.tenants import check_tenant_id

MAX_TIMEOUT_MS = 3_600_000  # one hour: longer is almost certainly a unit mistake (Triton's own timeout is in us)
_HEADER = re.compile(r"^[a-z0-9-]{1,64}$")


@dataclass(frozen=True)
class TenancyConfig:
    """Where tenant limits come from and which header names the tenant (the tensorrt_llm model's config.pbtxt,
    read by backend/serving/parameters.py). Both are set by the operator; nothing from a request picks a file."""

    limits_file: Path | None = None
    tenant_header: str = "x-tenant-id"

    def __post_init__(self) -> None:
        if not _HEADER.match(self.tenant_header):
            raise ValueError(f"tenant_header must be a lower-case header name, got {self.tenant_header!r}")


@dataclass(frozen=True)
class RequestContext:
    tenant_id: str | None  # None: the default tenant
    timeout_ms: int | None  # None: no deadline


def _timeout(params: Mapping[str, object]) -> int | None:
    for name in ("timeout_ms", "timeout"):
        if name not in params:
            continue
        value = params[name]
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT_MS:
            raise InvalidRequestError(f"request parameter {name} must be an integer number of milliseconds in "
                                      f"[1, {MAX_TIMEOUT_MS}], got {value!r}")
        return value
    return None


def request_context(parameters_json: str, tenant_header: str = "x-tenant-id") -> RequestContext:
    """Parse request.parameters(); raises InvalidRequestError naming a bad tenant id or timeout."""
    try:
        params = json.loads(parameters_json) if parameters_json else {}
    except json.JSONDecodeError:
        params = {}
    if not isinstance(params, dict):
        params = {}
    tenant = params.get(tenant_header, params.get("tenant_id"))
    if tenant is not None:
        if not isinstance(tenant, str):
            raise InvalidRequestError(f"tenant id must be a string, got {tenant!r}")
        try:
            tenant = check_tenant_id(tenant)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    return RequestContext(tenant_id=tenant, timeout_ms=_timeout(params))
