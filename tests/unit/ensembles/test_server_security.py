"""The launcher's secure defaults: restricted admin APIs behind a key, credential and tenant headers forwarded."""
from __future__ import annotations

from pathlib import Path

import pytest

from ensembles.server import ServerOptions, TritonInstall, server_command


def _cmd(tmp_path, **opts) -> list[str]:
    install = TritonInstall(binary=Path("/bin/tritonserver"), backend_dir=None)
    return server_command(install, ServerOptions(tmp_path, 8000, 8001, 8002, **opts))


def test_admin_key_restricts_repository_and_shared_memory(tmp_path):
    cmd = _cmd(tmp_path, admin_key="s3cret")
    assert "--grpc-restricted-protocol=model-repository,shared-memory,trace,logging:x-admin-key=s3cret" in cmd
    assert "--http-restricted-api=model-repository,shared-memory,trace,logging:x-admin-key=s3cret" in cmd
    pattern = "(?i)^(authorization|x-tritonllm-front-key|x-tenant-id)$"
    assert f"--grpc-header-forward-pattern={pattern}" in cmd and f"--http-header-forward-pattern={pattern}" in cmd


def test_no_key_no_restriction_credentials_still_forwarded(tmp_path):
    cmd = _cmd(tmp_path, tenant_header=None)
    assert not [a for a in cmd if "restricted" in a]
    assert "--grpc-header-forward-pattern=(?i)^(authorization|x-tritonllm-front-key)$" in cmd


def test_cli_admin_key_given_or_generated_and_printed(capsys, monkeypatch):
    from ensembles import cli

    assert cli.admin_key("mine") == "mine"
    key = cli.admin_key(None)
    assert len(key) >= 32 and key in capsys.readouterr().err
    assert cli.admin_key(None) != key
    monkeypatch.setenv("TRITONLLM_ADMIN_KEY", "from-env")
    args = cli._parser().parse_args(["serve", "--demo", "--limits-file", "l.toml"])
    assert args.admin_key == "from-env" and str(args.limits_file) == "l.toml"


def test_no_cpus_for_tritonserver_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cpus must name at least one CPU"):
        ServerOptions(tmp_path, 8000, 8001, 8002, cpus=frozenset())
