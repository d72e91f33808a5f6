"""backend/formats/versions.py: installing builds as new versions of the tensorrt_llm model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.formats.versions import ARTIFACT_FILE, VersionArtifact, artifact_for, install_version, list_versions


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "tensorrt_llm" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py").write_text("# adapter\n")
    return tmp_path / "repo"


def _engine(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_install_next_version_copies_adapter_and_writes_artifact(tmp_path):
    repo = _repo(tmp_path)
    engine = _engine(tmp_path, "build-a")
    assert install_version(repo, engine, meta={"quant": "fp8"}) == 2
    assert list_versions(repo) == [1, 2]
    assert (repo / "tensorrt_llm" / "2" / "model.py").read_text() == "# adapter\n"
    art = artifact_for(repo / "tensorrt_llm", 2)
    assert art == VersionArtifact(engine.resolve(), {"quant": "fp8"})
    assert artifact_for(repo / "tensorrt_llm", 1) is None
    assert install_version(repo, _engine(tmp_path, "build-b"), version=7) == 7
    assert install_version(repo, engine) == 8


def test_install_refuses_existing_version_and_non_checkpoint(tmp_path):
    repo = _repo(tmp_path)
    with pytest.raises(ValueError, match="already exists"):
        install_version(repo, _engine(tmp_path, "b"), version=1)
    with pytest.raises(ValueError, match="no config.json"):
        install_version(repo, tmp_path)
    with pytest.raises(ValueError, match="positive"):
        install_version(repo, _engine(tmp_path, "c"), version=0)
    with pytest.raises(ValueError, match="not a model folder"):
        list_versions(repo, "nope")


def test_bad_artifact_file_is_a_clear_error(tmp_path):
    repo = _repo(tmp_path)
    (repo / "tensorrt_llm" / "1" / ARTIFACT_FILE).write_text(json.dumps({"engine": "x"}))
    with pytest.raises(ValueError, match="not a valid artifact.json"):
        artifact_for(repo / "tensorrt_llm", 1)
    with pytest.raises(ValueError, match="absolute"):
        VersionArtifact(Path("relative"))


def test_only_ascii_positive_integer_folders_are_versions(tmp_path):
    repo = _repo(tmp_path)
    for name in ("\u00b2", "\u0663", "0", "x1", "007"):  # "²" and "٣" pass str.isdigit; int("²") raises
        (repo / "tensorrt_llm" / name).mkdir()
    assert list_versions(repo) == [1, 7]
