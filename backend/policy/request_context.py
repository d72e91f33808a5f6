"""Who sent a request and how long it may take: the tenant and deadline, from Triton request parameters.

Triton 2.51 passes an ensemble request's parameters on to every composing model (verified against the embedded
server: preprocessing and tensorrt_llm both see them), and headers matching `--grpc-header-forward-pattern` /
`--http-header-forward-pattern` arrive as parameters too (gRPC and HTTP /infer; not HTTP /generate in 2.51, whose
clients put the same names in the JSON body), so the tensorrt_llm model reads them directly.

Parameters read (request.parameters() is a JSON object; header names are matched case-insensitively):
- credentials: `authorization` ("Bearer <api key>"), `x-tritonllm-front-key` (the trusted front's credential);
- a claimed tenant: the tenant header (default `x-tenant-id`) or `tenant_id`; honoured only as api_keys.py says;
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
from backend.policy.api_keys import (
    AUTHORIZATION,
    CLAIM_PARAMETER,
    FRONT_KEY,
    Credentials,
    Presented,
    bearer_key,
    resolve_tenant,
)
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
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():  # "²" is a digit to str
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT_MS:
            raise InvalidRequestError(f"request parameter {name} must be an integer number of milliseconds in "
                                      f"[1, {MAX_TIMEOUT_MS}], got {value!r}")
        return value
    return None


def _claimed_tenant(params: Mapping[str, object], headers: Mapping[str, object], tenant_header: str) -> str | None:
    from_header, from_param = headers.get(tenant_header), params.get(CLAIM_PARAMETER)
    if from_header is not None and from_param is not None and from_header != from_param:
        raise InvalidRequestError(f"the {tenant_header} header and the {CLAIM_PARAMETER} parameter name different "
                                  "tenants")
    tenant = from_header if from_header is not None else from_param
    if tenant is None:
        return None
    if not isinstance(tenant, str):
        raise InvalidRequestError(f"tenant id must be a string, got {tenant!r}")
    try:
        return check_tenant_id(tenant)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def presented_credentials(params: Mapping[str, object], tenant_header: str = "x-tenant-id") -> Presented:
    """The request's API key, front credential and claimed tenant (not yet checked against the stored keys)."""
    headers = {str(k).lower(): v for k, v in params.items()}  # HTTP header names arrive as the client wrote them
    api_key = bearer_key(headers[AUTHORIZATION]) if AUTHORIZATION in headers else None
    front = headers.get(FRONT_KEY)
    if front is not None and not isinstance(front, str):
        raise InvalidRequestError(f"{FRONT_KEY} must be a string")
    return Presented(api_key=api_key, front_key=front, claimed_tenant=_claimed_tenant(params, headers, tenant_header))


def request_context(parameters_json: str, tenant_header: str = "x-tenant-id",
                    credentials: Credentials | None = None) -> RequestContext:
    """Parse request.parameters() and decide the tenant; raises InvalidRequestError naming a bad tenant id or
    timeout, AuthenticationError (a subclass) when the credentials do not allow the request."""
    try:
        params = json.loads(parameters_json) if parameters_json else {}
    except json.JSONDecodeError:
        params = {}
    if not isinstance(params, dict):
        params = {}
    presented = presented_credentials(params, tenant_header)
    tenant = resolve_tenant(credentials or Credentials(), presented)
    return RequestContext(tenant_id=tenant, timeout_ms=_timeout(params))
