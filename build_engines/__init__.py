"""Build pipeline: the demo model (trained at setup), random test models, and the
HF -> TensorRT-LLM checkpoint converter. Run `python -m build_engines --help`."""
