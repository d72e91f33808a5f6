"""Fixtures of the ensembles tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def fake_model(tmp_path) -> tuple[Path, Path]:
    """(engine_dir, tokenizer_dir) that pass RepoSpec's checks: enough to render a repository, not to serve it."""
    engine, tokenizer = tmp_path / "engine", tmp_path / "tok"
    engine.mkdir()
    tokenizer.mkdir()
    (engine / "config.json").write_text("{}")
    (tokenizer / "tokenizer.json").write_text("{}")
    return engine, tokenizer
