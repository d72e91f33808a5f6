#!/usr/bin/env bash
# aiperf (NVIDIA's OpenAI-API benchmark client, PyPI aiperf 0.13.0) in its own virtualenv, perf/.venv-aiperf
# (gitignored; ~3 min and ~1.2 GB: pandas, pyarrow, scipy, transformers...). Kept out of the project's own
# dependencies, like genai-perf. Idempotent: does nothing when the virtualenv already has aiperf.
#
#     bash perf/aiperf/setup.sh          # AIPERF_VENV=<dir> to put it elsewhere
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${AIPERF_VENV:-$ROOT/perf/.venv-aiperf}
if [[ -x $VENV/bin/aiperf ]]; then
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "aiperf==0.13.0"
"$VENV/bin/aiperf" --version
