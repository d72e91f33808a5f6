"""Tenants and their limits: the limits file (TOML or YAML) -> validated dataclasses.

A request's tenant is decided by its credentials (backend/policy/api_keys.py: the tenant's API key, or a trusted
front naming it); requests without one belong to the default tenant, and ids the file does not name share the
default tenant's limits and buckets (so made-up ids cannot mint fresh buckets). Tiers carry defaults and a scheduler
priority level; a tenant names its tier and may override any limit. No Triton import: unit-tested anywhere.

Example (TOML; the YAML form has the same keys):

    [global]
    max_queued_requests = 64      # admitted, first token not produced yet, all tenants
    max_queued_tokens = 65536     # prompt + max_tokens of those requests
    salt_prefix_cache = false     # default for tenants that do not say
    priority_aging_s = 10         # a waiting request gains a priority level per 10 s waited (0: strict)

    [tiers.premium]
    priority = 2
    requests_per_s = 20
    tokens_per_s = 20000

    [tenants.alice]
    tier = "premium"
    max_concurrent = 8
    api_key_sha256 = ["<hex>"]    # python -m ensembles keys new --tenant alice
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import tomllib
import yaml

from backend.policy.api_keys import Credentials, credentials_from_dict

DEFAULT_TENANT = "default"
# Tenant ids end up in metric labels and log lines: keep them short and plain.
_TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_LIMIT_KEYS = ("requests_per_s", "request_burst", "tokens_per_s", "token_burst", "max_concurrent", "queue_share",
               "salt_prefix_cache")


class LimitsFileError(ValueError):
    """The limits file is malformed: the message names the file, the section and the key."""


def check_tenant_id(tenant_id: str) -> str:
    """A tenant id from a request, validated (raises ValueError naming the rule)."""
    if not _TENANT_ID.match(tenant_id):
        raise ValueError(f"tenant id {tenant_id[:80]!r} is invalid: 1-64 characters of letters, digits, '.', '_', "
                         "'-', starting with a letter or digit")
    return tenant_id


@dataclass(frozen=True)
class Tier:
    """Defaults shared by the tenants of a tier; priority is the scheduler level (higher is served first)."""

    name: str
    priority: int = 1
    requests_per_s: float = math.inf
    request_burst: float | None = None  # None: one second's worth (at least 1)
    tokens_per_s: float = math.inf  # prompt tokens + max_tokens reserved per second
    token_burst: float | None = None
    max_concurrent: int | None = None  # requests admitted and not finished; None: no cap
    # Share of the global queue caps this tier's requests may fill: lower tiers are refused first under overload.
    queue_share: float = 1.0
    salt_prefix_cache: bool | None = None  # None: the global default

    def __post_init__(self) -> None:
        for name in ("requests_per_s", "tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{self.name}: {name} must be > 0, got {getattr(self, name)}")
        for name in ("request_burst", "token_burst"):
            value = getattr(self, name)
            if value is not None and not (value >= 1 and math.isfinite(value)):
                raise ValueError(f"{self.name}: {name} must be a finite number >= 1, got {value}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"{self.name}: max_concurrent must be >= 1, got {self.max_concurrent}")
        if not 0 < self.queue_share <= 1:
            raise ValueError(f"{self.name}: queue_share must be in (0, 1], got {self.queue_share}")
        if not 0 <= self.priority <= 100:
            raise ValueError(f"{self.name}: priority must be in [0, 100], got {self.priority}")

    @property
    def request_capacity(self) -> float:
        return self.request_burst if self.request_burst is not None else max(1.0, self.requests_per_s)

    @property
    def token_capacity(self) -> float:
        return self.token_burst if self.token_burst is not None else max(1.0, self.tokens_per_s)


# The built-in tiers: premium > standard > batch.
BUILTIN_TIERS = {
    "premium": Tier("premium", priority=2),
    "standard": Tier("standard", priority=1),
    "batch": Tier("batch", priority=0, queue_share=0.5),
}


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's effective limits: its tier's, with the tenant's own overrides applied."""

    tenant: str
    tier: str
    limits: Tier  # the merged values (name: the tenant)
    salt_prefix_cache: bool

    @property
    def priority(self) -> int:
        return self.limits.priority

    @property
    def cache_salt(self) -> str | None:
        """The prefix-cache extra key: salted tenants share blocks with nobody else."""
        return f"tenant:{self.tenant}" if self.salt_prefix_cache else None


@dataclass(frozen=True)
class LimitsConfig:
    max_queued_requests: int | None = None  # None: no global cap
    max_queued_tokens: int | None = None
    salt_prefix_cache: bool = False
    # A waiting request gains one priority level per this many seconds (the engine scheduler's aging): under a
    # higher tier's overload a lower tier waits longer, never forever. 0: strict priority.
    priority_aging_s: float = 10.0
    tiers: Mapping[str, Tier] = field(default_factory=lambda: dict(BUILTIN_TIERS))
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    credentials: Credentials = field(default_factory=Credentials)  # API keys, trusted front (api_keys.py)

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"global {name} must be >= 1, got {value}")
        aging = self.priority_aging_s
        if isinstance(aging, bool) or not isinstance(aging, (int, float)) or not 0 <= aging < math.inf:
            raise ValueError(f"global priority_aging_s must be a number of seconds >= 0 (0: strict priority), "
                             f"got {aging!r}")
        if DEFAULT_TENANT not in self.tenants:
            tenants = dict(self.tenants)
            tenants[DEFAULT_TENANT] = _merge(DEFAULT_TENANT, self.tiers["standard"], {}, self.salt_prefix_cache)
            object.__setattr__(self, "tenants", tenants)

    @property
    def engine_priority_aging_s(self) -> float | None:
        """EngineConfig.priority_aging_s: None for strict priority."""
        return float(self.priority_aging_s) or None

    def for_tenant(self, tenant_id: str | None) -> TenantLimits:
        """Limits of a request's tenant: unknown and missing ids get the default tenant's."""
        return self.tenants.get(tenant_id or DEFAULT_TENANT) or self.tenants[DEFAULT_TENANT]


def _merge(tenant: str, tier: Tier, overrides: Mapping[str, Any], global_salt: bool) -> TenantLimits:
    values = {k: v for k, v in overrides.items() if k in _LIMIT_KEYS}
    merged = dataclasses.replace(tier, name=tenant, **values)
    salt = merged.salt_prefix_cache if merged.salt_prefix_cache is not None else global_salt
    return TenantLimits(tenant=tenant, tier=tier.name, limits=merged, salt_prefix_cache=salt)


def _check_keys(section: str, values: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    if not isinstance(values, Mapping):
        raise ValueError(f"[{section}] must be a table of keys, got {type(values).__name__}")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"[{section}] has unknown keys {unknown}; allowed: {sorted(allowed)}")


def limits_from_dict(data: Mapping[str, Any]) -> LimitsConfig:
    """The parsed limits file -> LimitsConfig (raises ValueError naming the section and key)."""
    _check_keys("top level", data, ("global", "tiers", "tenants"))
    glob = data.get("global", {})
    _check_keys("global", glob, ("max_queued_requests", "max_queued_tokens", "salt_prefix_cache",
                                 "priority_aging_s", "trusted_front_key_sha256", "allow_anonymous"))
    tiers = dict(BUILTIN_TIERS)
    for name, values in (data.get("tiers") or {}).items():
        _check_keys(f"tiers.{name}", values, _LIMIT_KEYS + ("priority",))
        base = tiers.get(name, Tier(name))
        tiers[name] = dataclasses.replace(base, **values)
    salt = bool(glob.get("salt_prefix_cache", False))
    tenants = {}
    tenant_tables = data.get("tenants") or {}
    for name, values in tenant_tables.items():
        check_tenant_id(name)
        _check_keys(f"tenants.{name}", values, _LIMIT_KEYS + ("tier", "api_key_sha256"))
        tier_name = values.get("tier", "standard")
        if tier_name not in tiers:
            raise ValueError(f"[tenants.{name}] names tier {tier_name!r}; known tiers: {sorted(tiers)}")
        tenants[name] = _merge(name, tiers[tier_name], values, salt)
    return LimitsConfig(max_queued_requests=glob.get("max_queued_requests"),
                        max_queued_tokens=glob.get("max_queued_tokens"), salt_prefix_cache=salt,
                        priority_aging_s=glob.get("priority_aging_s", LimitsConfig.priority_aging_s),
                        tiers=tiers, tenants=tenants, credentials=credentials_from_dict(glob, tenant_tables))


def load_limits(path: str | Path | None) -> LimitsConfig:
    """Read a limits file (.toml, .yaml or .yml); None or "" means no limits beyond the defaults."""
    if not path:
        return LimitsConfig()
    path = Path(path)
    try:
        if path.suffix not in (".toml", ".yaml", ".yml"):
            raise ValueError("the limits file must end in .toml, .yaml or .yml")
        text = path.read_text()
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text) or {}
        return limits_from_dict(data)
    except (OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        raise LimitsFileError(f"limits file {path}: {exc}") from None
