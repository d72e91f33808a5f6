"""The compiled kernels as they were at a git revision, built beside the current ones under another name, for
side-by-side timings in one process (perf/probes/paged_decode_ab.py, perf/probes/decode_step_ab.py). A measurement
aid, not a test."""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

from torch.utils import cpp_extension

from backend.model.kernels.build import CFLAGS, ldflags

REPO = Path(__file__).resolve().parents[2]
KERNELS = "backend/model/kernels"


def build_at(rev: str) -> ModuleType:
    """The kernel sources `rev` had (and its headers), compiled as its own extension (once per commit: the build
    stays in the temporary directory)."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.strip()[:12]
    out = Path(tempfile.gettempdir()) / f"tritonllm-kernels-{commit}"
    out.mkdir(exist_ok=True)
    names = _sources_at(rev)
    for name in names + _sources_at(rev, ".h"):
        text = subprocess.run(["git", "show", f"{rev}:{KERNELS}/{name}"], cwd=REPO, check=True, capture_output=True,
                              text=True).stdout
        path = out / name
        if not path.exists() or path.read_text() != text:  # unchanged sources keep their build
            path.write_text(text)
    sources = [str(out / name) for name in names]
    return cpp_extension.load(f"tritonllm_kernels_at_{commit}", sources, extra_cflags=list(CFLAGS),
                              extra_ldflags=ldflags(), build_directory=str(out))


def _sources_at(rev: str, suffix: str = ".cpp") -> list[str]:
    """The kernel sources (or headers) `rev` had: a later commit may add some (row_ops.cpp, pool_lines.h), so not
    today's SOURCES."""
    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{KERNELS}"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.split()
    return [name for name in listing if name.endswith(suffix)]
