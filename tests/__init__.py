"""Tests. Importing backend first sets its OpenMP wait policy before anything here loads torch (backend/__init__.py)."""
import backend  # noqa: F401
