"""Build artifacts into directories atomically, and find them again by content hash.

Every builder here writes into a fresh temporary directory beside its destination and
renames it into place only when it is complete, so a crash (or a concurrent builder)
never leaves a half-written model where a reader would pick it up.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Written last into a cached build directory; its presence means "complete".
COMPLETE_MARKER = "COMPLETE"
CACHE_ENV = "TRITONLLM_CACHE"


def default_cache_root() -> Path:
    """`$TRITONLLM_CACHE`, else `<repo>/.cache` (the repo is the parent of this package)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / ".cache"


def short_hash(payload: object, length: int = 12) -> str:
    """Stable hex digest of a JSON-serialisable payload (key order does not matter)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def is_complete(directory: Path) -> bool:
    return (directory / COMPLETE_MARKER).is_file()


@contextmanager
def atomic_dir(final: Path, marker: bool = False, keep_complete: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory; on normal exit it replaces `final`.

    The temporary directory lives in `final.parent` so the rename never crosses a file
    system. With `marker`, COMPLETE_MARKER is written last, just before the rename. With
    `keep_complete`, a complete `final` published meanwhile by another process wins and
    ours is discarded. On an exception the temporary directory is removed and `final`
    is left untouched.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        if marker:
            (tmp / COMPLETE_MARKER).write_text("ok\n")
        _make_readable(tmp)
        if keep_complete and is_complete(final):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """Return `final` if a complete build is there; else run `build(tmp_dir)` and publish it."""
    if not is_complete(final):
        with atomic_dir(final, marker=True, keep_complete=True) as tmp:
            build(tmp)
    return final


def _make_readable(root: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files); a server running as
    another user must still read the published build."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, moving an existing `dst` out of the way first."""
    if not dst.exists():
        os.rename(src, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.rename(dst, old / dst.name)
    os.rename(src, dst)
    shutil.rmtree(old, ignore_errors=True)
