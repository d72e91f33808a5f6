"""API keys -> tenants, for the OpenAI API.

Keys live in the limits file, hashed (backend/policy/api_keys.py). With keys configured every /v1 request needs
`Authorization: Bearer <key>`; the key's tenant is what Triton sees (the tenant header, which Triton forwards to
the models), so the tenant's rate limits, priority and prefix-cache salt apply. Without keys the request's own
tenant header (if any) passes through, as it does for gRPC clients. The key is never logged or labelled.
"""
from __future__ import annotations

from pathlib import Path

from frontend.openai_api.errors import OpenAIError, invalid_api_key


class Authenticator:
    def __init__(self, keys=None, tenant_header: str = "x-tenant-id") -> None:
        self.keys = keys  # None: no keys configured
        self.tenant_header = tenant_header

    @classmethod
    def from_limits_file(cls, path: Path | None, tenant_header: str) -> "Authenticator":
        return cls(None, tenant_header)

    def tenant(self, authorization: str | None, claimed: str | None) -> str | None:
        """The request's tenant: the key's (401 without a valid key when keys are configured), else the header's."""
        if self.keys is None:
            return claimed
        scheme, _, key = (authorization or "").partition(" ")
        tenant = self.keys.authenticate(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if tenant is None:
            raise invalid_api_key()
        if claimed is not None and claimed != tenant:
            raise OpenAIError(403, f"this API key belongs to another tenant than the {self.tenant_header} header "
                              "names; leave the header out", code="tenant_mismatch")
        return tenant

    def upstream_headers(self, tenant: str | None) -> dict[str, str]:
        return {self.tenant_header: tenant} if tenant else {}
