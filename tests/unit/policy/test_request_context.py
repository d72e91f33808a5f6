"""Tenant and deadline from Triton request parameters (a JSON object): credentials decide the tenant."""
from __future__ import annotations

import json

import pytest

from backend.errors import InvalidRequestError
from backend.policy.api_keys import AuthenticationError, Credentials, key_hash, new_key
from backend.policy.request_context import RequestContext, TenancyConfig, request_context

KEY, FRONT = new_key(), new_key()
CREDS = Credentials(tenant_keys={"acme": (key_hash(KEY),)}, front_keys=(key_hash(FRONT),))


def test_the_api_key_decides_the_tenant():
    # As forwarded from a gRPC header (lower case), or an HTTP header as the client wrote it.
    assert request_context(json.dumps({"authorization": f"Bearer {KEY}", "timeout_ms": 500}), credentials=CREDS) == \
        RequestContext("acme", 500)
    assert request_context(json.dumps({"Authorization": f"Bearer {KEY}", "timeout": "250"}), credentials=CREDS) == \
        RequestContext("acme", 250)
    assert request_context(json.dumps({"authorization": f"Bearer {KEY}", "x-tenant-id": "acme"}),
                           credentials=CREDS).tenant_id == "acme"


def test_a_claim_counts_only_from_the_trusted_front():
    front = {"x-tritonllm-front-key": FRONT}
    assert request_context(json.dumps({**front, "x-tenant-id": "beta"}), credentials=CREDS).tenant_id == "beta"
    assert request_context(json.dumps({**front, "tenant_id": "beta"}), credentials=CREDS).tenant_id == "beta"
    assert request_context(json.dumps({**front, "X-Org": "beta"}), "x-org", credentials=CREDS).tenant_id == "beta"
    for params in ({"x-tenant-id": "acme"}, {"tenant_id": "acme"}):
        with pytest.raises(AuthenticationError, match="only from the trusted front"):
            request_context(json.dumps(params), credentials=CREDS)
    with pytest.raises(AuthenticationError, match="needs an API key"):
        request_context("", credentials=CREDS)


def test_no_keys_configured_anonymous_is_the_default_tenant():
    assert request_context("") == RequestContext(None, None)
    assert request_context("{}", tenant_header="x-org") == RequestContext(None, None)
    with pytest.raises(AuthenticationError, match="only from the trusted front"):
        request_context(json.dumps({"x-tenant-id": "acme"}))


@pytest.mark.parametrize("params, message", [
    ({"tenant_id": "../../etc/passwd"}, "tenant id"),
    ({"tenant_id": 7}, "must be a string"),
    ({"x-tenant-id": "a", "tenant_id": "b"}, "name different tenants"),
    ({"authorization": "Basic abc"}, "must be 'Bearer <api key>'"),
    ({"x-tritonllm-front-key": 5}, "x-tritonllm-front-key must be a string"),
    ({"timeout_ms": 0}, "timeout_ms must be an integer"),
    ({"timeout_ms": "\u00b2"}, "timeout_ms must be an integer"),  # str.isdigit says yes, int() says no
    ({"timeout_ms": " \u0663 "}, "timeout_ms must be an integer"),  # an Arabic-Indic three
    ({"timeout_ms": 10**9}, "timeout_ms must be an integer"),
    ({"timeout": True}, "timeout must be an integer"),
])
def test_bad_parameters_are_invalid_arg(params, message):
    with pytest.raises(InvalidRequestError, match=message):
        request_context(json.dumps({"x-tritonllm-front-key": FRONT, **params}), credentials=CREDS)


def test_tenancy_config_refuses_a_bad_header_name():
    with pytest.raises(ValueError, match="tenant_header"):
        TenancyConfig(tenant_header="X Bad")
