"""tritonllm's public HTTP front: a KServe v2 proxy before Triton's own HTTP (bounded, validated JSON bodies) and
an OpenAI-compatible API over the ensemble (gRPC streaming to Triton). See docs/front.md."""
