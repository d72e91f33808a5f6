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
import os

# The wait policy of torch's OpenMP threads, chosen for shared CPUs: libgomp's default spins at every barrier, and
# when another process takes part of a core a decode step collapses 3-15x (perf/REPORT.md, issue 16); passive
# threads sleep instead. libgomp reads this once, when torch is first loaded, so it is set here, before any of our
# modules imports torch (Triton's Python models import backend first). A value in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
