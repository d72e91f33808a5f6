"""backend/__init__.py's OpenMP wait policy: a bounded spin (PASSIVE + GOMP_SPINCOUNT) unless the environment chose
a policy, a warning when it comes too late (torch loaded first), and every entry point that runs torch in-process
imports backend before anything that could load torch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.import_rules import ROOT, imports_of, module_name

# What may be imported before backend: none of these loads torch (tritonllm_env only puts our packages on sys.path).
HARMLESS = set(sys.stdlib_module_names) | {"__future__", "numpy", "triton_python_backend_utils", "tritonllm_env"}
# A perf script that imports one of these runs torch in-process (bench_engine and engine_load: perf's own engine runs;
# transformers imports torch even for a tokenizer).
TORCH_USERS = ("torch", "safetensors", "transformers", "backend.engine", "backend.model", "build_engines",
               "bench_engine", "engine_load")


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)


POLICY = "import os, backend; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"


def test_importing_backend_defaults_to_a_bounded_spin():
    done = run(POLICY)
    assert done.stdout.split() == ["PASSIVE", "20000"] and "too late" not in done.stderr


@pytest.mark.parametrize("env, expected", [({"OMP_WAIT_POLICY": "ACTIVE"}, ["ACTIVE", "None"]),
                                           ({"OMP_WAIT_POLICY": "PASSIVE"}, ["PASSIVE", "None"]),
                                           ({"GOMP_SPINCOUNT": "0"}, ["None", "0"])])
def test_the_environment_wins(env, expected):
    assert run(POLICY, **env).stdout.split() == expected


def test_the_test_process_keeps_threads_sleeping():
    assert run("import os, tests; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
               ).stdout.split() == ["PASSIVE", "None"]


def test_torch_first_is_reported():
    assert "torch was imported before backend" in run("import torch, backend").stderr


def runs_torch(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TORCH_USERS)


def entry_points() -> list:
    """Scripts that run torch in-process (perf/*.py importing it, directly or through our packages), the Triton
    models, and the packages whose import must set the policy for what follows (build_engines, tests)."""
    scripts = sorted([*(ROOT / "perf").glob("*.py"), *(ROOT / "perf" / "probes").glob("*.py")])
    perf = [p for p in scripts if any(runs_torch(name) for _, name, _ in imports_of(p.read_text(), module_name(p)))]
    models = sorted((ROOT / "model_repository").glob("*/1/model.py"))
    return perf + models + [ROOT / "build_engines" / "__init__.py", ROOT / "tests" / "__init__.py"]


@pytest.mark.parametrize("path", entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_entry_points_import_backend_before_torch(path):
    names = [name for _, name, top in imports_of(path.read_text(), module_name(path)) if top]
    first = next((i for i, n in enumerate(names) if n == "backend" or n.startswith("backend.")), None)
    assert first is not None, f"{path.name} never imports backend"
    early = [n for n in names[:first] if n.split(".")[0] not in HARMLESS]
    assert not early, f"{path.name} imports {early} before backend (the OpenMP wait policy would come too late)"
