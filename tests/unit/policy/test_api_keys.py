"""API keys bound to tenants: hashing, constant-time lookup, the limits-file keys, and the tenant rule."""
from __future__ import annotations

import hmac

import pytest

from backend.policy import api_keys
from backend.policy.api_keys import (
    AuthenticationError,
    Credentials,
    Presented,
    bearer_key,
    credentials_from_dict,
    key_hash,
    new_key,
    resolve_tenant,
)
from backend.policy.tenants import limits_from_dict

ACME, EVALS, FRONT, OLD_ACME = new_key(), new_key(), new_key(), new_key()
CREDS = Credentials(tenant_keys={"acme": (key_hash(OLD_ACME), key_hash(ACME)), "nightly-evals": (key_hash(EVALS),)},
                    front_keys=(key_hash(FRONT),))


def test_keys_are_random_and_stored_as_sha256_hex():
    assert ACME.startswith("tllm_") and len(ACME) >= 40 and ACME != new_key()
    digest = key_hash(ACME)
    assert len(digest) == 64 and int(digest, 16) >= 0 and ACME not in digest


def test_authenticate_finds_the_tenant_of_any_of_its_keys():
    assert CREDS.authenticate(ACME) == "acme"
    assert CREDS.authenticate(OLD_ACME) == "acme"  # rotation: both keys work until the old digest is dropped
    assert CREDS.authenticate(EVALS) == "nightly-evals"
    assert CREDS.authenticate(new_key()) is None
    assert CREDS.authenticate(FRONT) is None  # the front's credential is not a tenant key
    assert CREDS.authenticate(ACME + "x" * 300) is None
    assert CREDS.is_front(FRONT) and not CREDS.is_front(ACME)


def test_every_stored_digest_is_compared_even_after_a_match(monkeypatch):
    calls = []

    def counting(a, b):
        calls.append(b)
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(api_keys, "_matches", counting)
    assert CREDS.authenticate(OLD_ACME) == "acme"  # the very first digest matches
    assert len(calls) == 3


@pytest.mark.parametrize("presented, tenant", [
    (Presented(api_key=ACME), "acme"),
    (Presented(api_key=ACME, claimed_tenant="acme"), "acme"),  # a matching claim is fine
    (Presented(front_key=FRONT, claimed_tenant="nightly-evals"), "nightly-evals"),  # the front speaks for tenants
    (Presented(front_key=FRONT, api_key=EVALS), "nightly-evals"),
    (Presented(front_key=FRONT), None),
])
def test_tenant_rule(presented, tenant):
    assert resolve_tenant(CREDS, presented) == tenant


@pytest.mark.parametrize("presented, message", [
    (Presented(claimed_tenant="acme"), "honoured only from the trusted front"),
    (Presented(api_key=EVALS, claimed_tenant="acme"), "is not the API key's tenant"),
    (Presented(api_key=new_key()), "the API key presented is not valid"),
    (Presented(front_key=new_key(), claimed_tenant="acme"), "trusted-front credential (x-tritonllm-front-key) is not"),
    (Presented(front_key=FRONT, api_key=new_key()), "the API key presented is not valid"),
    (Presented(), "this server needs an API key"),  # keys are configured: anonymous requests are refused
])
def test_refusals_say_why_and_never_echo_a_key(presented, message):
    with pytest.raises(AuthenticationError, match="^unauthenticated: ") as err:
        resolve_tenant(CREDS, presented)
    assert message in str(err.value)
    assert not any(k in str(err.value) for k in (ACME, EVALS, FRONT) + tuple(filter(None, (presented.api_key,))))
    assert ACME not in repr(presented) and FRONT not in repr(presented)


def test_without_keys_anonymous_requests_are_the_default_tenant_but_claims_are_refused():
    open_server = Credentials()
    assert open_server.allow_anonymous and resolve_tenant(open_server, Presented()) is None
    with pytest.raises(AuthenticationError, match="only from the trusted front"):
        resolve_tenant(open_server, Presented(claimed_tenant="acme"))
    explicit = Credentials(tenant_keys={"acme": (key_hash(ACME),)}, allow_anonymous=True)
    assert resolve_tenant(explicit, Presented()) is None


def test_bearer_values():
    assert bearer_key(f"Bearer {ACME}") == ACME
    assert bearer_key(f"  bearer   {ACME} ") == ACME
    for bad in ("", "Bearer", "Basic abc", ACME, 7):
        with pytest.raises(AuthenticationError, match="must be 'Bearer <api key>'"):
            bearer_key(bad)


def test_limits_file_keys():
    data = {"global": {"trusted_front_key_sha256": [key_hash(FRONT)]},
            "tenants": {"acme": {"tier": "premium", "api_key_sha256": [key_hash(ACME)]}, "other": {}}}
    config = limits_from_dict(data)
    assert config.credentials.authenticate(ACME) == "acme" and config.credentials.is_front(FRONT)
    assert config.credentials.allow_anonymous is False
    assert config.for_tenant("acme").priority == 2  # the key is not a limit: the tier still applies


@pytest.mark.parametrize("glob, tenants, message", [
    ({}, {"a": {"api_key_sha256": "abc"}}, "must be a non-empty list"),
    ({}, {"a": {"api_key_sha256": [ACME]}}, "is not a SHA-256 hex digest"),
    ({}, {"a": {"api_key_sha256": [key_hash(ACME)]}, "b": {"api_key_sha256": [key_hash(ACME)]}}, "listed twice"),
    ({"trusted_front_key_sha256": [key_hash(ACME)]}, {"a": {"api_key_sha256": [key_hash(ACME)]}}, "listed twice"),
    ({"allow_anonymous": "yes"}, {}, "allow_anonymous must be true or false"),
])
def test_bad_key_entries_are_refused(glob, tenants, message):
    with pytest.raises(ValueError, match=message):
        credentials_from_dict(glob, tenants)
    with pytest.raises(ValueError, match=message):
        limits_from_dict({"global": glob, "tenants": tenants})


def test_a_key_in_the_wrong_table_is_an_unknown_key():
    with pytest.raises(ValueError, match="unknown keys"):
        limits_from_dict({"tiers": {"premium": {"api_key_sha256": [key_hash(ACME)]}}})
