"""The torch decoder and what runs it: config, loader, StepInputs, runner, quantized modules, parallelism."""
import torch

# The oldest torch the model code runs on: SDPA's enable_gqa (decoder.attend) came in 2.5. pip enforces pyproject's
# bound; this names the problem where torch was installed around it (a container's own torch, --no-deps).
MIN_TORCH = "2.5"
if torch.__version__ < MIN_TORCH:  # TorchVersion compares as a version, not as a string
    raise ImportError(f"tritonllm needs torch>={MIN_TORCH}; this environment has torch {torch.__version__}")
