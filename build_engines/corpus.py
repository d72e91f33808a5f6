"""The demo corpus: the running interpreter's standard-library Python sources.

It is on every machine, needs no network and is real code, so a small model trained on
it produces recognisably Python-like text. Files are listed in sorted order and a fixed
subset of them (every `heldout_every`-th) is held out for perplexity measurements.
"""

from __future__ import annotations

import platform
import sysconfig
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

# Directories that are tests, third-party packages, or generated data rather than code
# (pydoc_data/topics.py is 750 kB of documentation text, encodings/ is mostly byte tables).
DEFAULT_SKIP_DIRS = ("__pycache__", "encodings", "idle_test", "pydoc_data", "site-packages", "test", "tests")


@dataclass(frozen=True)
class CorpusSpec:
    """Which files make up the corpus and which are held out.

    `python_version` names the stdlib the corpus comes from; it is part of every cache
    key built on this corpus, and a build refuses to run on a different interpreter.
    """

    python_version: str = field(default_factory=platform.python_version)
    heldout_every: int = 50
    skip_dirs: tuple[str, ...] = DEFAULT_SKIP_DIRS

    def __post_init__(self) -> None:
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2 (got {self.heldout_every}): a held-out file every "
                             "file would leave nothing to train on")

    def check_interpreter(self) -> None:
        if self.python_version != platform.python_version():
            raise RuntimeError(f"corpus is the Python {self.python_version} stdlib but this interpreter is "
                               f"{platform.python_version()}; build with that interpreter or a new recipe")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(spec: CorpusSpec) -> list[Path]:
    """All corpus files, sorted by path relative to the stdlib root (deterministic order)."""
    root = stdlib_root()
    skip = set(spec.skip_dirs)
    files = [p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_files(spec: CorpusSpec) -> tuple[list[Path], list[Path]]:
    """(train, heldout): file i is held out when i % heldout_every == heldout_every // 2."""
    files = source_files(spec)
    pick = spec.heldout_every // 2
    train = [p for i, p in enumerate(files) if i % spec.heldout_every != pick]
    heldout = [p for i, p in enumerate(files) if i % spec.heldout_every == pick]
    return train, heldout


def read_source(path: Path) -> str:
    """File text decoded per its PEP 263 encoding cookie (a few stdlib files are not UTF-8)."""
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError):
        return path.read_bytes().decode("utf-8", errors="replace")


def training_texts(spec: CorpusSpec) -> list[str]:
    spec.check_interpreter()
    return [read_source(p) for p in split_files(spec)[0]]


def heldout_text(max_chars: int, spec: CorpusSpec | None = None) -> str:
    """The held-out files concatenated (newline-separated), cut to at most `max_chars`."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    return _concat(split_files(spec or CorpusSpec())[1], max_chars)


def heldout_part_text(max_chars: int, part: int, parts: int = 2, spec: CorpusSpec | None = None) -> str:
    """Held-out file i is in part i % parts: disjoint held-out texts, e.g. for calibrating a quantizer (part 0)
    and measuring it (part 1). Concatenated (newline-separated) and cut to at most `max_chars`."""
    if max_chars <= 0 or not 0 <= part < parts:
        raise ValueError(f"need max_chars > 0 and 0 <= part < parts, got {max_chars}, {part}, {parts}")
    spec = spec or CorpusSpec()
    spec.check_interpreter()
    return _concat(split_files(spec)[1][part::parts], max_chars)


def _concat(paths: list[Path], max_chars: int) -> str:
    parts: list[str] = []
    total = 0
    for path in paths:
        parts.append(read_source(path))
        total += len(parts[-1]) + 1
        if total >= max_chars:
            break
    return "\n".join(parts)[:max_chars]
