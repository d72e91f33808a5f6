#!/usr/bin/env bash
# perf_analyzer sweeps against a running server (make serve): gRPC streaming to the ensemble by concurrency and by
# request rate, then the tensorrt_llm model directly. Tables print as they finish; raw CSVs, exports and logs go
# to perf/out/perf_analyzer/. Needs `make perf-tools` once.
#
#     perf/perf_analyzer/run.sh [GRPC_URL]          # default localhost:8001; MAX_TOKENS=64 COUNT=32 override
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
URL=${1:-localhost:8001}
MAX_TOKENS=${MAX_TOKENS:-64}
COUNT=${COUNT:-32}
OUT=${OUT:-$ROOT/perf/out/perf_analyzer}
sweep() { "$PY" "$ROOT/perf/perf_analyzer/sweep.py" --url "$URL" --max-tokens "$MAX_TOKENS" --request-count "$COUNT" "$@"; }
sweep --target ensemble --concurrency 1 2 4 8 16 --out "$OUT/ensemble_concurrency"
sweep --target ensemble --request-rate 1 2 4 8 --request-count 0 --out "$OUT/ensemble_rate"  # time windows
sweep --target tensorrt_llm --concurrency 1 4 16 --out "$OUT/tensorrt_llm_concurrency"
