"""`python -m ensembles keys`: a minted key authenticates its tenant through the limits-file line printed for it."""
from __future__ import annotations

import io

import tomllib

from backend.policy.api_keys import key_hash
from backend.policy.tenants import limits_from_dict
from ensembles import cli


def _minted(capsys, *args: str) -> tuple[str, dict]:
    assert cli.main(["keys", "new", *args]) == 0
    first, *toml_lines = capsys.readouterr().out.splitlines()
    return first.rsplit(": ", 1)[1], tomllib.loads("\n".join(toml_lines))


def test_new_tenant_key_and_its_limits_file_line(capsys):
    key, table = _minted(capsys, "--tenant", "acme")
    assert table == {"tenants": {"acme": {"api_key_sha256": [key_hash(key)]}}}
    assert limits_from_dict(table).credentials.authenticate(key) == "acme"
    other, _ = _minted(capsys, "--tenant", "acme")
    assert other != key


def test_new_front_credential(capsys):
    key, table = _minted(capsys, "--front")
    assert limits_from_dict(table).credentials.is_front(key)


def test_hash_of_an_existing_key_and_refusals(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("tllm_abc\n"))
    assert cli.main(["keys", "hash"]) == 0
    assert capsys.readouterr().out.strip() == key_hash("tllm_abc")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["keys", "hash"]) == 2
    assert cli.main(["keys", "new", "--tenant", "../x"]) == 2
    assert "tenant id" in capsys.readouterr().err
