"""Compiled CPU kernels the model uses where torch's operators cost more (built on first use, cached)."""
