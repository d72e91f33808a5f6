"""Tests. Importing backend first sets its OpenMP wait policy before anything here loads torch (backend/__init__.py).

The test process runs engines, tritonservers and HF references on the same cores at once: it keeps OpenMP threads
sleeping at barriers (no spin), the setting that degrades least on shared cores, and its servers inherit it.
tests/unit/test_omp_wait_policy.py checks backend's own default in fresh processes.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import backend  # noqa: E402, F401
