"""The in-flight batching core: scheduler, KV blocks and prefix cache, sampler, LLMEngine (no Triton)."""
