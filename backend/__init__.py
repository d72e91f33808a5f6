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

errors.py (InvalidRequestError) is a leaf every layer may import. No module here imports Triton (the Triton
models under model_repository/ are thin adapters that pass pb_utils in), build_engines, ensembles or perf.
Outside: build_engines imports backend; ensembles imports both; frontend (the HTTP front) imports backend.policy
only; perf imports anything and nothing imports perf.
tests/unit/test_layers.py checks all of this by parsing every import (tests/unit/import_rules.py holds the rules).
"""
import logging
import os
import sys


def passive_omp_wait() -> None:
    """Make torch's OpenMP threads sleep at barriers instead of spinning, unless the environment chose a policy.

    Shared CPUs: libgomp's default spins at every barrier, and when another process takes part of a core a decode
    step collapses 3-15x (perf/ISSUE16.md); passive threads sleep instead. libgomp reads OMP_WAIT_POLICY once, when
    torch first loads it, so this must run before the process imports torch: importing backend runs it, and every
    entry point that runs our engine imports backend first (Triton's model.py files, build_engines, tests/__init__.py,
    the perf scripts; tests/unit/test_omp_wait_policy.py checks them). Processes started later inherit the value.
    """
    if "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if "torch" in sys.modules:
        logging.getLogger(__name__).warning(
            "torch was imported before backend: OMP_WAIT_POLICY=PASSIVE comes too late for this process (its OpenMP "
            "threads spin at barriers); import backend first or set OMP_WAIT_POLICY in the environment")


passive_omp_wait()
