"""Model versions of the tensorrt_llm model: each numbered folder may carry its own engine artifact.

Layout (Triton's, plus one file of ours):
    <repo>/tensorrt_llm/config.pbtxt        gpt_model_path: the default artifact (version 1's, as rendered)
    <repo>/tensorrt_llm/<N>/model.py        the same thin adapter in every version
    <repo>/tensorrt_llm/<N>/artifact.json   {"engine_dir": "/abs/path", ...}: what version N serves

The adapter reads `<N>/artifact.json` when present, else falls back to gpt_model_path; so the build pipeline
installs a build as version N+1 beside version N, and canary routing picks versions by number.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ARTIFACT_FILE = "artifact.json"
LLM_MODEL = "tensorrt_llm"


@dataclass(frozen=True)
class VersionArtifact:
    """What one version of the LLM model serves. `meta` is free-form (build report summary, quantization...)."""

    engine_dir: Path
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not Path(self.engine_dir).is_absolute():
            raise ValueError(f"engine_dir must be an absolute path, got {self.engine_dir}")

    def to_json(self) -> str:
        return json.dumps({"engine_dir": str(self.engine_dir), "meta": self.meta}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> "VersionArtifact":
        try:
            data = json.loads(Path(path).read_text())
            return cls(engine_dir=Path(data["engine_dir"]), meta=dict(data.get("meta") or {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a valid {ARTIFACT_FILE}: {exc}") from exc


def list_versions(repo_dir: Path, model: str = LLM_MODEL) -> list[int]:
    """Numbered version folders of `model`, ascending."""
    model_dir = Path(repo_dir) / model
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir} is not a model folder of the repository")
    # Triton's own rule: a folder whose name is a positive integer (ASCII digits: "²" is a digit to str.isdigit)
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) > 0)


def artifact_for(model_dir: Path, version: int) -> VersionArtifact | None:
    """The artifact version `version` of the model in `model_dir` serves, or None (use the config's default)."""
    path = Path(model_dir) / str(int(version)) / ARTIFACT_FILE
    return VersionArtifact.read(path) if path.is_file() else None


def install_version(repo_dir: Path, engine_dir: Path, version: int | None = None, model: str = LLM_MODEL,
                    meta: dict | None = None) -> int:
    """Add a version of `model` serving `engine_dir`; returns its number (next after the highest by default).

    The new folder gets a copy of the lowest version's files (model.py ...) and an artifact.json; existing
    versions are untouched. An existing version number is refused, so nothing served is overwritten.
    """
    engine_dir = Path(engine_dir).resolve()
    if not (engine_dir / "config.json").is_file():
        raise ValueError(f"{engine_dir} holds no config.json: not a built checkpoint or engine")
    versions = list_versions(repo_dir, model)
    if not versions:
        raise ValueError(f"{Path(repo_dir) / model} has no version folder to copy the adapter from")
    number = max(versions) + 1 if version is None else int(version)
    if number <= 0:
        raise ValueError(f"version must be a positive integer, got {version}")
    if number in versions:
        raise ValueError(f"version {number} of {model} already exists; choose another or remove it first")
    model_dir = Path(repo_dir) / model
    template, target = model_dir / str(versions[0]), model_dir / str(number)
    shutil.copytree(template, target, ignore=shutil.ignore_patterns("__pycache__", ARTIFACT_FILE))
    artifact = VersionArtifact(engine_dir=engine_dir, meta=dict(meta or {}))
    (target / ARTIFACT_FILE).write_text(artifact.to_json())
    return number
