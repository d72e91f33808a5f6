"""Tenant id and deadline from Triton request parameters (a JSON object)."""
from __future__ import annotations

import json

import pytest

from backend.errors import InvalidRequestError
from backend.policy.request_context import RequestContext, TenancyConfig, request_context


def test_header_wins_over_parameter():
    params = json.dumps({"x-tenant-id": "from-header", "tenant_id": "from-param", "timeout_ms": 500})
    assert request_context(params) == RequestContext("from-header", 500)
    assert request_context(json.dumps({"tenant_id": "p", "timeout": "250"})) == RequestContext("p", 250)
    assert request_context("") == RequestContext(None, None)
    assert request_context("{}", tenant_header="x-org") == RequestContext(None, None)


@pytest.mark.parametrize("params, message", [
    ({"tenant_id": "../../etc/passwd"}, "tenant id"),
    ({"tenant_id": 7}, "must be a string"),
    ({"timeout_ms": 0}, "timeout_ms must be an integer"),
    ({"timeout_ms": 10**9}, "timeout_ms must be an integer"),
    ({"timeout": True}, "timeout must be an integer"),
])
def test_bad_parameters_are_invalid_arg(params, message):
    with pytest.raises(InvalidRequestError, match=message):
        request_context(json.dumps(params))


def test_tenancy_config_refuses_a_bad_header_name():
    with pytest.raises(ValueError, match="tenant_header"):
        TenancyConfig(tenant_header="X Bad")
