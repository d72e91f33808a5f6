"""Build pipeline: the demo model (trained at setup), random test models, and the
HF -> TensorRT-LLM checkpoint converter. Run `python -m build_engines --help`.

Importing backend first sets its OpenMP wait policy before any build step loads torch (backend/__init__.py)."""
import backend  # noqa: F401
