"""API keys -> tenants, for the OpenAI API (backend/policy/api_keys.py holds the rule and the stored digests).

With keys in the limits file every /v1 request needs `Authorization: Bearer <key>` (refused with 401 here, before
the body is read); the key's tenant is what Triton sees: the front forwards the key (`authorization`) and the
tenant (the tenant header), both forwarded by Triton to the models, so the tenant's rate limits, priority and
prefix-cache salt apply and the model checks the key once more. Without keys, requests are anonymous (the default
tenant): the openai SDK always sends some key, which then means nothing and is not forwarded. A tenant header
from the client is honoured only together with that tenant's own key. Keys are never logged nor labelled.
"""
from __future__ import annotations

from pathlib import Path

from backend.policy.api_keys import AUTHORIZATION, AuthenticationError, Credentials, Presented, resolve_tenant
from backend.policy.tenants import check_tenant_id, load_limits
from frontend.openai_api.errors import OpenAIError, bad_request


class Authenticator:
    def __init__(self, credentials: Credentials | None, tenant_header: str = "x-tenant-id") -> None:
        self.credentials = credentials  # None: no keys configured
        self.tenant_header = tenant_header

    @classmethod
    def from_limits_file(cls, path: Path | None, tenant_header: str) -> "Authenticator":
        credentials = load_limits(path).credentials if path is not None else None
        has_keys = credentials is not None and bool(credentials.tenant_keys)
        return cls(credentials if has_keys else None, tenant_header)

    def identify(self, authorization: str | None, claimed: str | None) -> tuple[str | None, str | None]:
        """(tenant, key to forward) of a request; 401 when its credentials do not allow it."""
        if claimed is not None:
            try:
                check_tenant_id(claimed)
            except ValueError as exc:
                raise bad_request(str(exc), self.tenant_header) from None
        if self.credentials is None:
            if claimed is not None:
                raise _unauthenticated(f"the {self.tenant_header} header is honoured only with the tenant's API "
                                       "key, and this server has none configured")
            return None, None
        key = _bearer(authorization)
        try:
            tenant = resolve_tenant(self.credentials, Presented(api_key=key, claimed_tenant=claimed))
        except AuthenticationError as exc:
            raise _unauthenticated(str(exc)) from None
        return tenant, key

    def upstream_headers(self, tenant: str | None, key: str | None) -> dict[str, str]:
        """gRPC metadata toward Triton: the key (the model checks it again) and the tenant it belongs to."""
        headers = {}
        if key is not None:
            headers[AUTHORIZATION] = f"Bearer {key}"
        if tenant is not None:
            headers[self.tenant_header] = tenant
        return headers


def _bearer(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthenticated("the Authorization header must be 'Bearer <api key>'")
    return key.strip()


def _unauthenticated(reason: str) -> OpenAIError:
    return OpenAIError(401, reason, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
