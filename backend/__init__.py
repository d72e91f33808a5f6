"""tritonllm's PyTorch LLM engine: paged KV cache, in-flight batching, sampling.

Nothing in this package imports Triton: the Triton models under model_repository/ are thin adapters over it.
"""
