"""Engine configuration: the limits an engine instance is built for (the anchor's config.pbtxt parameters)."""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from enum import Enum
from typing import Any

from backend.kernel_choices import (
    ATTENTION_KERNELS, CUDA_GRAPH_MODES, DECODE_GEMV, DECODE_LAYERS, LINEAR_DTYPES, LINEAR_KERNELS)


class SchedulerPolicy(str, Enum):
    # Admit a request only when the KV blocks for its whole prompt + max_tokens are free: it can always finish.
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"
    # Admit when the next chunk fits; under KV pressure the newest sequence is preempted (recomputed later).
    MAX_UTILIZATION = "max_utilization"


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 16  # sequences in the running batch
    max_num_tokens: int = 2048  # tokens processed per engine step: decode tokens + prefill chunks
    max_input_len: int = 1024  # longest prompt accepted
    max_seq_len: int = 2048  # prompt + generated tokens
    tokens_per_block: int = 32  # KV cache block size, in tokens
    # KV cache capacity in tokens; None: enough for max_batch_size full-length sequences.
    max_tokens_in_paged_kv_cache: int | None = None
    # Share of the memory free after loading the weights that the KV cache may take (on CPU: of available RAM).
    kv_cache_free_mem_fraction: float = 0.9
    policy: SchedulerPolicy = SchedulerPolicy.GUARANTEED_NO_EVICT
    enable_chunked_context: bool = True
    enable_kv_cache_reuse: bool = True  # prefix caching: reuse the KV blocks of a shared prompt prefix
    device: str = "auto"  # "cpu", "cuda", "cuda:N", or "auto": CUDA when torch sees a GPU
    num_threads: int | None = None  # torch intra-op threads on CPU; None: torch's default
    # On CPU, use up to num_threads per step, as many as measured fastest now (backend/engine/thread_governor.py):
    # fewer when another process takes part of the cores. False: always num_threads.
    adaptive_threads: bool = True
    # A waiting request gains one priority level per this many seconds waited; None: strict priority (the served
    # path takes it from the limits file's [global] priority_aging_s, backend/policy/tenants.py).
    priority_aging_s: float | None = None
    # Float linears' kernel (backend/model/prepacked_linear.py): "onednn" (weights prepacked once; CPU, float32 or
    # native-bf16 CPUs), "torch" (F.linear: MKL on CPU), "auto" (onednn where it can run, else torch).
    linear_kernel: str = "auto"
    # Decode steps' attention (backend/model/kernels/paged_decode.py): "paged" (read in place from the KV pool by a
    # compiled kernel; CPU, float32), "torch" (gather + SDPA), "auto" (paged where it runs, else torch). With
    # "paged", prompts prefilled from position 0 over bf16 pools (bf16 linears) attend by the compiled causal kernel
    # where the CPU has AVX-512 BF16 (backend/model/kernels/causal_prefill.py).
    attention_kernel: str = "auto"
    # Decode steps' decoder layers (backend/model/kernels/decode_layers.py): "native" (one compiled call running the
    # same operations, bit-equal; needs the paged attention kernel and oneDNN linears), "python", "auto" (native
    # where it runs, else python).
    decode_layers: str = "auto"
    # The float linears' dtype (backend/model/prepacked_linear.py, resolve_linear_dtype): "checkpoint", "bfloat16"
    # (bf16 on oneDNN and a bf16 KV cache, the rest float32; CPUs with native bf16), "float32" (a bf16 / fp16
    # checkpoint's weights widened, exactly: a float32 model), "auto" (for an unquantized single-process checkpoint:
    # bfloat16 for a bf16 one where the CPU has native bf16, float32 for a bf16 or fp16 one on a CPU without it,
    # each where the KV cache keeps its capacity; else checkpoint).
    linear_dtype: str = "auto"
    # Decode steps replayed as CUDA graphs (backend/model/cuda_graphs.py; the anchor's cuda_graph_mode): "on" (CUDA,
    # one process), "off", "auto" (on where it runs: CUDA and an unsharded checkpoint).
    cuda_graph_mode: str = "auto"
    # Products of 1-16 rows of the prepacked linears (decode steps of up to 16 sequences) by a kernel over a second
    # copy of their weights (backend/model/kernels/gemv.py; oneDNN's copy serves more rows): bf16 linears beside
    # float32 activations on AVX-512 BF16 CPUs, float32 linears on AVX2 + FMA ones. "on" (where it runs), "off",
    # "auto" (on where it runs and the KV cache keeps the capacity it would have without the copy).
    decode_gemv: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_num_tokens", "max_input_len", "max_seq_len", "tokens_per_block"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be < max_seq_len ({self.max_seq_len}) to leave room to generate"
            )
        if not self.enable_chunked_context and self.max_num_tokens < self.max_input_len:
            raise ValueError(
                f"max_num_tokens ({self.max_num_tokens}) must be >= max_input_len ({self.max_input_len}) "
                "when chunked context is disabled: a prompt is prefilled in one step"
            )
        if self.max_num_tokens < self.max_batch_size:
            raise ValueError(f"max_num_tokens ({self.max_num_tokens}) must be >= max_batch_size ({self.max_batch_size})")
        if not 0.0 < self.kv_cache_free_mem_fraction <= 1.0:
            raise ValueError(f"kv_cache_free_mem_fraction must be in (0, 1], got {self.kv_cache_free_mem_fraction}")
        if self.kv_cache_tokens < self.max_seq_len:
            raise ValueError(
                f"max_tokens_in_paged_kv_cache ({self.kv_cache_tokens}) must hold at least one full sequence "
                f"(max_seq_len {self.max_seq_len})"
            )
        if self.priority_aging_s is not None and not 0.0 < self.priority_aging_s < float("inf"):
            raise ValueError(f"priority_aging_s must be a positive number of seconds, got {self.priority_aging_s}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be > 0 (or None for torch's default), got {self.num_threads}")
        object.__setattr__(self, "policy", SchedulerPolicy(self.policy))
        if self.device == "auto":
            import torch

            object.__setattr__(self, "device", "cuda" if torch.cuda.is_available() else "cpu")
        self._check_kernels()

    def _check_kernels(self) -> None:
        """The model runner checks the weights' dtype too (backend/model/prepacked_linear.py); here what the
        config alone decides."""
        if self.linear_kernel not in LINEAR_KERNELS:
            raise ValueError(f"linear_kernel must be one of {LINEAR_KERNELS}, got {self.linear_kernel!r}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {self.attention_kernel!r}")
        if self.attention_kernel == "paged" and not self.device.startswith("cpu"):
            raise ValueError(f"attention_kernel 'paged' runs on CPU only, not on device {self.device!r}")
        if self.decode_layers not in DECODE_LAYERS:
            raise ValueError(f"decode_layers must be one of {DECODE_LAYERS}, got {self.decode_layers!r}")
        if self.decode_layers == "native" and (self.attention_kernel == "torch" or self.linear_kernel == "torch"):
            raise ValueError(f"decode_layers 'native' needs the paged attention kernel and oneDNN linears, not "
                             f"attention_kernel {self.attention_kernel!r} / linear_kernel {self.linear_kernel!r}")
        if self.decode_layers == "native" and not self.device.startswith("cpu"):
            raise ValueError(f"decode_layers 'native' runs on CPU only, not on device {self.device!r}")
        if self.linear_dtype not in LINEAR_DTYPES:
            raise ValueError(f"linear_dtype must be one of {LINEAR_DTYPES}, got {self.linear_dtype!r}")
        if self.linear_dtype == "bfloat16" and (self.linear_kernel == "torch" or not self.device.startswith("cpu")):
            raise ValueError(f"linear_dtype 'bfloat16' runs on oneDNN on CPU, not linear_kernel "
                             f"{self.linear_kernel!r} on device {self.device!r}")
        if self.cuda_graph_mode not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph_mode must be one of {CUDA_GRAPH_MODES}, got {self.cuda_graph_mode!r}")
        if self.cuda_graph_mode == "on" and not self.device.startswith("cuda"):
            raise ValueError(f"cuda_graph_mode 'on' runs on CUDA only, not on device {self.device!r}")
        if self.decode_gemv not in DECODE_GEMV:
            raise ValueError(f"decode_gemv must be one of {DECODE_GEMV}, got {self.decode_gemv!r}")
        if self.decode_gemv == "on" and (self.linear_kernel == "torch" or not self.device.startswith("cpu")):
            raise ValueError(f"decode_gemv 'on' serves oneDNN-prepacked linears on CPU, not linear_kernel "
                             f"{self.linear_kernel!r} on device {self.device!r}")
        if self.linear_kernel != "onednn":
            return
        import torch

        if not self.device.startswith("cpu"):
            raise ValueError(f"linear_kernel 'onednn' runs on CPU only, not on device {self.device!r}")
        if not torch.backends.mkldnn.is_available():
            raise ValueError(f"linear_kernel 'onednn' is unavailable: torch {torch.__version__} has no oneDNN")

    @property
    def kv_cache_tokens(self) -> int:
        if self.max_tokens_in_paged_kv_cache is not None:
            return self.max_tokens_in_paged_kv_cache
        return self.max_batch_size * self.max_seq_len

    @property
    def max_output_len(self) -> int:
        return self.max_seq_len - 1


def engine_default(name: str) -> Any:
    """The default of EngineConfig field `name`: the one place engine limits get their defaults (the model
    repository renderer, the build spec and the config.pbtxt reader all take them from here)."""
    for f in fields(EngineConfig):
        if f.name == name and f.default is not MISSING:
            return f.default
    raise KeyError(f"EngineConfig has no field {name!r} with a default")
