# syntax=docker/dockerfile:1
# Two images of the same repository; pick one with --target:
#   docker build --target gpu -t tritonllm:gpu .   # NVIDIA GPU: NGC Triton + TensorRT-LLM container
#   docker build --target cpu -t tritonllm:cpu .   # anywhere: slim Python + CPU torch + embedded tritonserver
# Both serve the demo model repository on 8000 (HTTP), 8001 (gRPC), 8002 (metrics).

# --- gpu: NVIDIA's Triton TensorRT-LLM image already has tritonserver on PATH, TensorRT-LLM, a CUDA
# torch, transformers, tokenizers and safetensors. Install the package without its dependencies so pip
# never replaces NVIDIA's torch build, then add only the pure-Python dependencies the image lacks.
FROM nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3 AS gpu
ENV PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONUNBUFFERED=1
WORKDIR /opt/tritonllm
COPY . .
RUN pip install --no-deps -e . \
 && pip install "tritonclient[grpc,http]>=2.50" "requests>=2.31" "pyyaml>=6" "tqdm>=4.66" \
    "onnx>=1.16" "onnxscript>=0.2" "onnxruntime>=1.18" "polygraphy>=0.49"
# Train the demo model at build time (a few minutes), so the container serves at once.
RUN python3 -m build_engines demo
EXPOSE 8000 8001 8002 8003
CMD ["python3", "-m", "ensembles", "serve", "--demo", "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", "--health-port", "8003"]

# --- cpu (default target): no NVIDIA base. The slim image's Python is built shared
# (/usr/local/lib/libpython3.11.so), which the Python backend stub of the embedded tritonserver needs.
# CPU torch comes first, from PyTorch's CPU index, so ".[server]" finds torch satisfied instead of
# pulling the CUDA wheels from PyPI; the `server` extra brings tritonserver in the nvidia-pytriton wheel.
FROM python:3.11-slim-bookworm AS cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/tritonllm
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . .
# g++ builds the compiled kernels (backend/model/kernels/: paged decode attention, a decode step's layers; for the CPU
# they run on: a different CPU at run time builds them again there).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
# Editable: the model repository templates (model_repository/) are read from the source tree.
RUN pip install -e ".[server]" && python3 -m backend.model.kernels.build && python3 -m build_engines demo
EXPOSE 8000 8001 8002 8003
CMD ["python3", "-m", "ensembles", "serve", "--demo", "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", "--health-port", "8003"]
