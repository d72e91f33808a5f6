"""Limits file parsing and validation: tiers, overrides, the default tenant, bad files."""
from __future__ import annotations

import math

import pytest

from backend.policy.tenants import DEFAULT_TENANT, LimitsFileError, check_tenant_id, limits_from_dict, load_limits

TOML = """
[global]
max_queued_requests = 8
salt_prefix_cache = false

[tiers.premium]
requests_per_s = 10

[tenants.alice]
tier = "premium"
max_concurrent = 2
salt_prefix_cache = true

[tenants.bob]
tier = "batch"
tokens_per_s = 100
"""


def test_toml_file_merges_tier_and_tenant(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text(TOML)
    config = load_limits(path)
    alice, bob = config.for_tenant("alice"), config.for_tenant("bob")
    assert (alice.priority, alice.limits.requests_per_s, alice.limits.max_concurrent) == (2, 10, 2)
    assert alice.cache_salt == "tenant:alice" and bob.cache_salt is None
    assert (bob.priority, bob.limits.tokens_per_s, bob.limits.queue_share) == (0, 100, 0.5)
    assert config.max_queued_requests == 8


def test_yaml_file_is_the_same(tmp_path):
    path = tmp_path / "limits.yaml"
    path.write_text("tenants:\n  alice:\n    tier: premium\n    requests_per_s: 3\n")
    assert load_limits(path).for_tenant("alice").limits.requests_per_s == 3


def test_unknown_and_missing_tenants_share_the_default():
    config = limits_from_dict({})
    assert config.for_tenant(None).tenant == DEFAULT_TENANT
    assert config.for_tenant("mallory").tenant == DEFAULT_TENANT
    assert config.for_tenant(None).priority == 1 and math.isinf(config.for_tenant(None).limits.requests_per_s)


@pytest.mark.parametrize("data, message", [
    ({"tenants": {"a": {"tier": "gold"}}}, "names tier 'gold'"),
    ({"tenants": {"a": {"rps": 1}}}, "unknown keys ['rps']"),
    ({"tenants": {"a": {"requests_per_s": 0}}}, "requests_per_s must be > 0"),
    ({"tenants": {"a": {"max_concurrent": 0}}}, "max_concurrent must be >= 1"),
    ({"tiers": {"x": {"queue_share": 2}}}, "queue_share must be in (0, 1]"),
    ({"global": {"max_queued_requests": 0}}, "max_queued_requests must be >= 1"),
    ({"global": {"priority_aging_s": -1}}, "priority_aging_s must be a number of seconds >= 0"),
    ({"global": {"priority_aging_s": "10"}}, "priority_aging_s must be a number of seconds >= 0"),
    ({"global": {"priority_aging_s": float("inf")}}, "priority_aging_s must be a number of seconds >= 0"),
    ({"global": {"priority_aging_s": float("nan")}}, "priority_aging_s must be a number of seconds >= 0"),
    ({"tenants": {"bad id!": {}}}, "tenant id"),
    ({"nonsense": {}}, "unknown keys ['nonsense']"),
])
def test_bad_limits_are_named(data, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        limits_from_dict(data)


def test_bad_file_names_the_file(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text("[tenants.a]\ntier = \n")
    with pytest.raises(LimitsFileError, match="limits.toml"):
        load_limits(path)
    with pytest.raises(LimitsFileError, match="must end in"):
        load_limits(tmp_path / "limits.json")
    assert load_limits(None).for_tenant("x").tenant == DEFAULT_TENANT


def test_tenant_ids_are_checked():
    assert check_tenant_id("team-a.prod_1") == "team-a.prod_1"
    for bad in ("", "../etc", "a" * 65, "x y", "é"):
        with pytest.raises(ValueError):
            check_tenant_id(bad)


def test_the_documented_example_file_loads():
    from pathlib import Path

    config = load_limits(Path(__file__).resolve().parents[3] / "docs" / "limits.example.toml")
    assert config.for_tenant("acme").cache_salt == "tenant:acme" and config.for_tenant("acme").priority == 2
    assert config.for_tenant("nightly-evals").limits.max_concurrent == 4
    assert config.for_tenant("someone-else").limits.requests_per_s == 2
    assert config.engine_priority_aging_s == 10.0


def test_priority_aging_reaches_the_engine_as_seconds_or_strict():
    assert limits_from_dict({}).engine_priority_aging_s == 10.0  # default: no starvation without a limits file
    assert limits_from_dict({"global": {"priority_aging_s": 2.5}}).engine_priority_aging_s == 2.5
    assert limits_from_dict({"global": {"priority_aging_s": 0}}).engine_priority_aging_s is None
