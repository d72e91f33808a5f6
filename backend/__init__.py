"""tritonllm's serving runtime: one package per layer, imports running one way only (down this list).

    serving   between Triton and the engine: the engine loop (the engine's thread), the tensor contract as numpy,
      |       the config.pbtxt reader, pre/postprocessing, streaming detokenization, the router's forwarding state
      |       machine, metrics publishers. Imports engine, model, formats, policy.
      |\\
      | policy   tenants, rate limiter, admission, request context, canary routing decisions. No torch, no Triton.
      |
    engine    in-flight batching: config, sampling params, sequences, prefix cache, block manager, scheduler,
      |       sampler, stats, KV memory plan, LLMEngine and the TensorRT-LLM executor engine (interface.py).
      |       The scheduler and its collaborators never import the model.
    model     the torch decoder, its config and loader, StepInputs (the model's whole view of a step), the runner,
      |       quantized linears / KV pools, tensor and pipeline parallelism (model/parallel/).
    formats   on-disk contracts the build and the runtime share: TRT-LLM checkpoint config and tensor names, rank
              layout, FP8 / INT4 / INT8 number formats, model-repository version artifacts. Imports nothing of ours.

errors.py (InvalidRequestError) is a leaf every layer may import; so is kernel_choices.py (the values of
EngineConfig's kernel choices, which the config and the model modules resolving them share). No module here imports
Triton (the Triton models under model_repository/ are thin adapters that pass pb_utils in), build_engines, ensembles
or perf.
Outside: build_engines imports backend; ensembles imports both; frontend (the HTTP front) imports backend.policy
only; perf imports anything and nothing imports perf.
tests/unit/test_layers.py checks all of this by parsing every import (tests/unit/import_rules.py holds the rules).
"""
import logging
import os
import sys

# Spins before a thread at an OpenMP barrier sleeps (libgomp's own default: 300000 when no policy is set, none with
# PASSIVE). perf/ISSUE16.md, "OpenMP spin before sleeping": 20000 made a 2-thread decode step 1.5x faster on a quiet
# machine; beside a busy process it collapses, which the engine's thread governor answers by dropping to one
# thread (backend/engine/thread_governor.py).
BOUNDED_SPIN = "20000"


def bounded_omp_wait() -> None:
    """Let torch's OpenMP threads spin briefly at barriers, then sleep, unless the environment chose a policy.

    libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when torch first loads it, so this must run before the
    process imports torch: importing backend runs it, and every entry point that runs our engine imports backend
    first (Triton's model.py files, build_engines, tests/__init__.py, the perf scripts; tests/unit/test_omp_wait_policy.py
    checks them). Processes started later inherit the values. OMP_WAIT_POLICY=PASSIVE in the environment means no
    spin at all (threads sleep at once: slower alone, steadier on cores shared with other work; docs/operations.md).
    """
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # libgomp: an explicit GOMP_SPINCOUNT overrides PASSIVE's zero spins
    os.environ["GOMP_SPINCOUNT"] = BOUNDED_SPIN
    if "torch" in sys.modules:
        logging.getLogger(__name__).warning(
            "torch was imported before backend: its OpenMP wait policy comes too late for this process (its threads "
            "spin at barriers for libgomp's default); import backend first or set OMP_WAIT_POLICY in the environment")


bounded_omp_wait()
