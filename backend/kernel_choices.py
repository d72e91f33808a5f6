"""The values each kernel choice of EngineConfig takes: one home for the config (which checks them without importing
torch) and the model modules that resolve them. A leaf like errors.py: imports nothing."""

LINEAR_KERNELS = ("auto", "torch", "onednn")  # backend/model/prepacked_linear.py
ATTENTION_KERNELS = ("auto", "torch", "paged")  # backend/model/kernels/paged_decode.py
DECODE_LAYERS = ("auto", "python", "native")  # backend/model/kernels/decode_layers.py
# "checkpoint": linears compute in the checkpoint's dtype; "bfloat16": in bfloat16 on oneDNN with everything else
# (embeddings, norms, attention, KV cache, residual stream, logits) in float32; "float32": a bfloat16 / float16
# checkpoint's weights widened (exactly) and everything computed in float32; "auto": bfloat16 for an unquantized
# single-process bfloat16 checkpoint where the CPU has native bf16 arithmetic, float32 for one in bfloat16 or float16
# on a CPU without it, else checkpoint.
LINEAR_DTYPES = ("auto", "checkpoint", "bfloat16", "float32")  # backend/model/prepacked_linear.py
CUDA_GRAPH_MODES = ("auto", "on", "off")  # backend/model/cuda_graphs.py
DECODE_GEMV = ("auto", "on", "off")  # backend/model/kernels/bf16_gemv.py
