"""Tenants bound to credentials (issue 11 item 8), through the real tritonserver serving docs/limits.example.toml
with test keys added: a claimed tenant no longer lifts limits or spends another tenant's quota; keys work over
gRPC metadata and the HTTP /generate body; the trusted front may name tenants; keys never reach the log."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import tomllib
import yaml

from backend.policy.api_keys import key_hash, new_key
from ensembles.render import REPO_ROOT, RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration import metrics
from tests.integration.conftest import _free_ports
from tests.integration.tenant_client import generate

EXAMPLE = REPO_ROOT / "docs" / "limits.example.toml"
KEYS = {"acme": new_key(), "nightly-evals": new_key(), "default": new_key()}
FRONT = new_key()
CLAIM_REFUSED = "unauthenticated: a tenant id (x-tenant-id / tenant_id) is honoured only from the trusted front"


@pytest.fixture(scope="module")
def aserver(demo, tmp_path_factory) -> TritonServer:
    root = tmp_path_factory.mktemp("tenant-auth")
    limits = tomllib.loads(EXAMPLE.read_text())  # the documented file, plus digests of keys this test holds
    limits["global"]["trusted_front_key_sha256"].append(key_hash(FRONT))
    for tenant, key in KEYS.items():
        limits["tenants"][tenant].setdefault("api_key_sha256", []).append(key_hash(key))
    (root / "limits.yaml").write_text(yaml.safe_dump(limits))
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=512, max_seq_len=1024, cancellation_check_period_ms=20,
                    limits_file=root / "limits.yaml")
    http, grpc, port = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, root / "model_repository"), http, grpc, port),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm"))
    yield srv
    srv.stop()
    log = (root / "tritonserver.log").read_text(errors="replace")
    assert not any(k in log for k in [FRONT, *KEYS.values()]), "an API key reached the server log"


def _burst(url: str, n: int, **kwargs) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: generate(url, f"def burst_{i}(", 2, **kwargs), range(n)))


def test_a_claimed_tenant_header_does_not_lift_the_default_limits(aserver):
    """Finding: `x-tenant-id: acme` got acme's premium limits (12/12 admitted; the default tenant's burst is 5)."""
    claimed = _burst(aserver.grpc_url, 12, headers={"x-tenant-id": "acme"})
    assert not [o for o in claimed if o.ok], "a tenant claim without credentials was served"
    assert all(CLAIM_REFUSED in o.error for o in claimed), claimed[0].error
    keyed = _burst(aserver.grpc_url, 12, api_key=KEYS["acme"])
    assert all(o.ok and o.texts for o in keyed), [o.error for o in keyed]  # acme's own key: premium, 12/12


def test_impostor_streams_cannot_spend_another_tenants_concurrency(aserver):
    """Finding: four streams sent as tenant_id=nightly-evals held that tenant's max_concurrent (4) and locked the
    real tenant out. Now they are refused at once, and the real tenant (its key, and its name) is served."""
    with ThreadPoolExecutor(4) as pool:
        impostors = [pool.submit(generate, aserver.grpc_url, f"def impostor_{i}(x):\n", 200, stream=True,
                                 parameters={"tenant_id": "nightly-evals"}) for i in range(4)]
        time.sleep(1.0)  # were they admitted, they would all be generating by now
        real = generate(aserver.grpc_url, "def real(", 4, api_key=KEYS["nightly-evals"],
                        headers={"x-tenant-id": "nightly-evals"})
        impostors = [f.result() for f in impostors]
    assert real.ok and real.texts, real.error
    assert all(not o.ok and CLAIM_REFUSED in o.error for o in impostors), [o.error for o in impostors]


def test_a_key_cannot_claim_another_tenant_and_bad_keys_are_refused(aserver):
    other = generate(aserver.grpc_url, "def ", 2, api_key=KEYS["default"], headers={"x-tenant-id": "acme"})
    assert "unauthenticated: the claimed tenant (x-tenant-id / tenant_id) is not the API key's tenant" in other.error
    wrong = generate(aserver.grpc_url, "def ", 2, api_key=new_key())
    assert "unauthenticated: the API key presented is not valid" in wrong.error
    anonymous = generate(aserver.grpc_url, "def ", 2)
    assert "unauthenticated: this server needs an API key" in anonymous.error
    bad_front = generate(aserver.grpc_url, "def ", 2, headers={"x-tritonllm-front-key": new_key(),
                                                                 "x-tenant-id": "acme"})
    assert "trusted-front credential (x-tritonllm-front-key) is not valid" in bad_front.error
    text = metrics.scrape(aserver.opts.metrics_port)
    assert metrics.wait_until(aserver.opts.metrics_port, "tritonllm_admission_total", lambda v: v >= 5,
                              tenant="", outcome="refused", reason="unauthenticated") >= 5, text[-2000:]


def test_the_trusted_front_names_the_tenant(aserver):
    front = {"x-tritonllm-front-key": FRONT}
    out = generate(aserver.grpc_url, "def front(", 2, headers={**front, "x-tenant-id": "nightly-evals"})
    assert out.ok and out.texts, out.error
    assert generate(aserver.grpc_url, "def front(", 2, headers=front).ok  # names none: the default tenant
    port = aserver.opts.metrics_port
    assert metrics.wait_until(port, "tritonllm_admission_total", lambda v: v >= 2, tenant="nightly-evals",
                              outcome="admitted") >= 2


def test_http_generate_takes_the_key_in_the_body_not_a_header(aserver):
    """Triton 2.51 forwards no header on /generate (only gRPC and /infer): the key is an `authorization` body field,
    which becomes a request parameter; the header alone is not seen there."""
    url = f"http://{aserver.http_url}/v2/models/ensemble/generate"
    body = {"text_input": "def ", "max_tokens": 2}
    ok = requests.post(url, json={**body, "authorization": f"Bearer {KEYS['acme']}"}, timeout=60)
    assert ok.status_code == 200 and ok.json()["text_output"], ok.text
    header_only = requests.post(url, json=body, headers={"Authorization": f"Bearer {KEYS['acme']}"}, timeout=60)
    assert header_only.status_code == 400 and "needs an API key" in header_only.json()["error"]
    claimed = requests.post(url, json={**body, "tenant_id": "acme"}, timeout=60)
    assert claimed.status_code == 400 and CLAIM_REFUSED in claimed.json()["error"]


def test_the_bls_model_passes_the_credentials_on(aserver):
    """tensorrt_llm_bls (one Python model calling tensorrt_llm) forwards the request's parameters, so the key decides
    the tenant there too (the canary router does the same)."""
    keyed = generate(aserver.grpc_url, "def bls(", 2, api_key=KEYS["acme"], model="tensorrt_llm_bls")
    assert keyed.ok and keyed.texts, keyed.error
    anonymous = generate(aserver.grpc_url, "def bls(", 2, model="tensorrt_llm_bls")
    assert "unauthenticated: this server needs an API key" in anonymous.error
    claimed = generate(aserver.grpc_url, "def bls(", 2, headers={"x-tenant-id": "acme"}, model="tensorrt_llm_bls")
    assert CLAIM_REFUSED in claimed.error
