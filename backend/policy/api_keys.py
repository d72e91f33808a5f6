"""Tenant credentials: API keys bound to tenants, and the rule that decides which tenant a request belongs to.

Keys are random strings (`tllm_` + 43 URL-safe characters, 256 bits) handed to a tenant once; the limits file keeps
only their SHA-256 hex digests, a list per tenant so a key can be rotated (add the new one, then drop the old):

    [global]
    trusted_front_key_sha256 = ["<hex>"]   # the credential of a front (API gateway, OpenAI front) we trust
    allow_anonymous = false                # default: false once any tenant has a key, true otherwise

    [tenants.acme]
    api_key_sha256 = ["<hex>", "<hex of the next key>"]

A presented key is hashed and compared with every stored digest by hmac.compare_digest, without stopping at a
match, so the time taken does not depend on which digest (if any) matched. Keys never appear in an error message,
a log line, a repr or a metric label: errors say which credential was wrong, never its value.

`resolve_tenant` is the one rule (docs/rate_limiting.md, "Tenants"):
1. a trusted front (its credential presented) names the tenant (claim), or passes the tenant's own key, or neither
   (the default tenant); a wrong front credential is refused;
2. else an API key decides the tenant; a claim naming another tenant is refused;
3. else a claim alone is refused: claims are honoured only from the trusted front;
4. else the default tenant, where anonymous requests are allowed; refused where keys are required.
Refusals raise AuthenticationError, an InvalidRequestError: Triton's Python backend has no UNAUTHENTICATED code,
INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) is the closest one that clients do not retry as is; the message
starts with "unauthenticated:" so a front can map it to HTTP 401. No Triton import, no torch.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from backend.errors import InvalidRequestError

KEY_PREFIX = "tllm_"
# Request parameter names (lower case). Headers of these names are forwarded by Triton as request parameters
# (gRPC metadata, HTTP /infer); HTTP /generate in Triton 2.51 forwards no header, so there they are body fields.
AUTHORIZATION = "authorization"  # value "Bearer <key>"
FRONT_KEY = "x-tritonllm-front-key"  # the trusted front's credential, raw
CLAIM_PARAMETER = "tenant_id"  # a claimed tenant (besides the tenant header, x-tenant-id by default)
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_MAX_KEY_CHARS = 256  # longer is not one of our keys; refused before hashing


class AuthenticationError(InvalidRequestError):
    """The request's credentials do not allow it (message: 'unauthenticated: ...', never a key's value)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"unauthenticated: {reason}")


def new_key() -> str:
    """A fresh API key (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """What the limits file stores for a key: its SHA-256, lower-case hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _digests(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where} must be a non-empty list of SHA-256 hex digests "
                         "(python -m ensembles keys new prints one)")
    for digest in value:
        if not isinstance(digest, str) or not _HEX_DIGEST.match(digest):
            raise ValueError(f"{where}: {str(digest)[:80]!r} is not a SHA-256 hex digest (64 characters 0-9a-f); "
                             "store the key's hash, never the key")
    return tuple(value)


def _matches(presented: str, digest: str) -> bool:
    return hmac.compare_digest(presented, digest)


@dataclass(frozen=True)
class Credentials:
    """Stored key digests: per tenant, and of the trusted front."""

    tenant_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    front_keys: tuple[str, ...] = ()
    allow_anonymous: bool | None = None  # None: allowed exactly when no tenant has a key

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        owned = [(t, d) for t, ds in self.tenant_keys.items() for d in ds] + [("trusted front", d)
                                                                              for d in self.front_keys]
        for owner, digest in owned:
            if digest in seen:
                raise ValueError(f"the key digest {digest[:8]}... is listed twice ({seen[digest]}, {owner}): "
                                 "each key belongs to one tenant")
            seen[digest] = owner
        if self.allow_anonymous is None:
            object.__setattr__(self, "allow_anonymous", not self.tenant_keys)

    def authenticate(self, presented_key: str) -> str | None:
        """The tenant whose key this is, or None. Compares with every stored digest (no early exit)."""
        digest = key_hash(presented_key[:_MAX_KEY_CHARS])
        found = None
        for tenant, digests in self.tenant_keys.items():
            for stored in digests:
                hit = _matches(digest, stored)
                found = tenant if hit else found
        return found if len(presented_key) <= _MAX_KEY_CHARS else None

    def is_front(self, presented_key: str) -> bool:
        digest = key_hash(presented_key[:_MAX_KEY_CHARS])
        hits = [_matches(digest, stored) for stored in self.front_keys]
        return any(hits) and len(presented_key) <= _MAX_KEY_CHARS


def credentials_from_dict(glob: Mapping[str, Any], tenants: Mapping[str, Mapping[str, Any]]) -> Credentials:
    """The limits file's [global] and [tenants.*] tables -> Credentials (ValueError naming the key)."""
    allow = glob.get("allow_anonymous")
    if allow is not None and not isinstance(allow, bool):
        raise ValueError(f"[global] allow_anonymous must be true or false, got {allow!r}")
    front = ()
    if "trusted_front_key_sha256" in glob:
        front = _digests("[global] trusted_front_key_sha256", glob["trusted_front_key_sha256"])
    keys = {name: _digests(f"[tenants.{name}] api_key_sha256", values["api_key_sha256"])
            for name, values in tenants.items() if "api_key_sha256" in values}
    return Credentials(tenant_keys=keys, front_keys=front, allow_anonymous=allow)


@dataclass(frozen=True)
class Presented:
    """What a request brought: its API key, the trusted front's credential, a claimed tenant id (validated by the
    caller). Secrets are left out of repr."""

    api_key: str | None = field(default=None, repr=False)
    front_key: str | None = field(default=None, repr=False)
    claimed_tenant: str | None = None


def bearer_key(value: Any) -> str:
    """The key of an `authorization: Bearer <key>` value."""
    scheme, _, key = value.strip().partition(" ") if isinstance(value, str) else ("", "", "")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationError("the authorization parameter must be 'Bearer <api key>'")
    return key.strip()


def resolve_tenant(credentials: Credentials, presented: Presented) -> str | None:
    """The request's tenant id (None: the default tenant), or AuthenticationError (see the module docstring)."""
    claim = presented.claimed_tenant
    if presented.front_key is not None:
        if not credentials.is_front(presented.front_key):
            raise AuthenticationError("the trusted-front credential (x-tritonllm-front-key) is not valid")
        if claim is not None:
            return claim
        return _by_key(credentials, presented.api_key) if presented.api_key is not None else None
    if presented.api_key is not None:
        tenant = _by_key(credentials, presented.api_key)
        if claim is not None and claim != tenant:
            raise AuthenticationError("the claimed tenant (x-tenant-id / tenant_id) is not the API key's tenant")
        return tenant
    if claim is not None:
        raise AuthenticationError("a tenant id (x-tenant-id / tenant_id) is honoured only from the trusted front; "
                                  "present the tenant's API key instead (authorization: Bearer <key>)")
    if not credentials.allow_anonymous:
        raise AuthenticationError("this server needs an API key: send 'authorization: Bearer <key>' (gRPC "
                                  "metadata or HTTP header; HTTP /generate: an \"authorization\" body field)")
    return None


def _by_key(credentials: Credentials, key: str) -> str:
    tenant = credentials.authenticate(key)
    if tenant is None:
        raise AuthenticationError("the API key presented is not valid")
    return tenant
