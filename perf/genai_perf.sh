#!/usr/bin/env bash
# genai-perf (NVIDIA's LLM benchmark CLI, PyPI genai-perf 0.0.16) against the ensemble, unchanged: Triton's
# KServe gRPC endpoint, tensorrtllm backend inputs, streaming. It lives in its own virtualenv
# (perf/.venv-genai-perf; ~1 min to make): it needs numpy>=2, while the project pins numpy<2 (nvidia-pytriton).
# It runs the perf_analyzer binary it finds on PATH: ours (perf/tools/perf_analyzer, `make perf-tools`) comes first.
# Exact output lengths: --output-tokens-mean-deterministic, which in 0.0.16 sends `min_length` (min_tokens' name in
# older tensorrtllm_backend ensembles; ours accepts it as an alias).
#
#     perf/genai_perf.sh [GRPC_URL]      # default localhost:8001; CONCURRENCY=4 REQUESTS=32 INPUT_TOKENS=128
#                                        # OUTPUT_TOKENS=64 TOKENIZER=<HF dir> (default: the demo model's)
# Results: perf/out/genai-perf/ (profile_export_genai_perf.{csv,json}: TTFT, ITL, output tokens/s, request latency).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${GENAI_PERF_VENV:-$ROOT/perf/.venv-genai-perf}
URL=${1:-localhost:8001}
if [[ ! -x $VENV/bin/genai-perf ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "genai-perf==0.0.16"
fi
[[ -x $ROOT/perf/.glibc/wheel/perf_analyzer/bin/perf_analyzer ]] || bash "$ROOT/perf/tools/setup_perf_analyzer.sh"
TOKENIZER=${TOKENIZER:-$("$ROOT/.venv/bin/python" -m build_engines demo)}
export PATH=$ROOT/perf/tools:$PATH HF_HUB_OFFLINE=1
exec "$VENV/bin/genai-perf" profile -m ensemble --endpoint-type kserve --backend tensorrtllm --streaming -u "$URL" \
    --tokenizer "$TOKENIZER" \
    --synthetic-input-tokens-mean "${INPUT_TOKENS:-128}" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "${OUTPUT_TOKENS:-64}" --output-tokens-stddev 0 --output-tokens-mean-deterministic \
    --concurrency "${CONCURRENCY:-4}" --request-count "${REQUESTS:-32}" --warmup-request-count 2 \
    --artifact-dir "${ARTIFACT_DIR:-$ROOT/perf/out/genai-perf}"
