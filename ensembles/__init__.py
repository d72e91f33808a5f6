"""Renders tritonllm's Triton model repository from the templates in model_repository/ and launches tritonserver."""
