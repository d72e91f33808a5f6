"""Runs one step of the model: StepInputs in, next-token logits out (the engine's batch never gets here)."""
from __future__ import annotations

import logging

import torch

from backend.model.causal_lm import CausalLM
from backend.model.config import torch_dtype
from backend.model.cuda_graphs import CaptureError, DecodeGraphs, resolve_cuda_graphs
from backend.model.decoder import AttentionMetadata
from backend.model.kernels.gemv import gemv_dtype, resolve_decode_gemv
from backend.model.kernels.causal_prefill import unsupported as causal_prefill_unsupported
from backend.model.kernels.decode_layers import resolve_decode_layers
from backend.model.kernels.paged_decode import resolve_attention_kernel
from backend.model.prepacked_linear import prepack_linears, resolve_linear_kernel
from backend.model.quantized_kv import kv_pools
from backend.model.step_inputs import StepInputs, step_tensors

log = logging.getLogger(__name__)


def model_step_tensors(model: CausalLM, inputs: StepInputs, device: torch.device, paged_decode: bool = False,
                       causal_prefill: bool = False) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
    """step_tensors() for this model: its rotary embedding, its layers' windows, its dtype."""
    return step_tensors(inputs, model.rotary, set(model.features.windows), torch_dtype(model.config), device,
                        paged_decode, causal_prefill)


def resolve_causal_prefill(attention_kernel: str, model: CausalLM, kv_layers: list, device: torch.device) -> bool:
    """Whether prefills from position 0 run the compiled causal kernel: with the paged attention kernel, over bf16
    pools (backend/model/kernels/causal_prefill.py); where it does not apply, the reason is logged."""
    if attention_kernel != "paged":
        return False
    pool = kv_layers[0][0] if kv_layers else None
    if not isinstance(pool, torch.Tensor) or pool.dtype == torch.float32:  # FP8 pools; float32 ones keep SDPA
        return False
    reason = causal_prefill_unsupported(model.config.head_size, pool.dtype, device)
    if reason is not None:
        log.info("prefill attention runs SDPA: %s", reason)
    return reason is None


class KVCache:
    """Per layer K and V pools: (num_blocks * block_size + scratch_rows, n_kv_heads, head_dim) each, in the model's
    dtype or `dtype` (bf16 beside bf16 linears), FP8 pools for an FP8 KV cache (backend/model/quantized_kv.py).
    Scratch rows lie past every block: the padded sequences of a CUDA graph's step write there
    (backend/model/cuda_graphs.py)."""

    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype | None = None, scratch_rows: int = 0) -> None:
        cfg = model.config
        self.scratch_slot = num_blocks * block_size  # the first scratch row, when there are any
        shape = (num_blocks * block_size + scratch_rows, cfg.num_key_value_heads, cfg.head_size)
        self.layers = kv_pools(model.transformer.layers, shape, dtype or torch_dtype(cfg), device)


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 linear_kernel: str = "torch", attention_kernel: str = "torch", decode_layers: str = "python",
                 linear_dtype: torch.dtype | None = None, cuda_graphs: str = "auto", decode_gemv: str = "off") -> None:
        """linear_kernel: "torch", "onednn" or "auto" (backend/model/prepacked_linear.py); attention_kernel: "torch",
        "paged" or "auto" for decode steps (backend/model/kernels/paged_decode.py); decode_layers: "python", "native"
        or "auto" (backend/model/kernels/decode_layers.py); linear_dtype: the oneDNN linears' dtype where it is not
        the model's (resolve_linear_dtype), and then the KV pools' too (K/V rows are stored as the linears' outputs
        would be in the checkpoint's own dtype: half the bytes of float32 rows to keep and to read). The chosen ones
        are kept in self.linear_kernel, self.attention_kernel and self.native_layers (None: the Python layers);
        cuda_graphs: "on", "off" or "auto" (on CUDA): decode steps replay CUDA graphs (backend/model/cuda_graphs.py;
        self.graphs, None when off); decode_gemv: "on", "off" or "auto": the prepacked linears' products of up to 16
        float32 rows by the GEMV (backend/model/kernels/gemv.py; self.decode_gemv)."""
        self.linear_kernel = resolve_linear_kernel(linear_kernel, device, torch_dtype(model.config))
        if linear_dtype is not None and self.linear_kernel != "onednn":
            raise ValueError(f"linears in {linear_dtype} beside {torch_dtype(model.config)} activations run on oneDNN "
                             f"only, not linear_kernel {linear_kernel!r}")
        self.attention_kernel = resolve_attention_kernel(attention_kernel, device, torch_dtype(model.config))
        self.decode_gemv = resolve_decode_gemv(decode_gemv, device, gemv_dtype(linear_dtype, torch_dtype(model.config)),
                                               self.linear_kernel == "onednn")
        self.model = (prepack_linears(model, linear_dtype, self.decode_gemv) if self.linear_kernel == "onednn"
                      else model)
        self.device = device
        graphs = resolve_cuda_graphs(cuda_graphs, device)
        self.cuda_graph_mode = cuda_graphs
        self.kv = KVCache(model, num_blocks, block_size, device, linear_dtype, scratch_rows=int(graphs))
        self.native_layers = resolve_decode_layers(decode_layers, self.model, self.kv.layers, self.attention_kernel)
        self.causal_prefill = resolve_causal_prefill(self.attention_kernel, model, self.kv.layers, device)
        self.graphs = DecodeGraphs(self._step_tensors, self._forward, self.kv.scratch_slot) if graphs else None

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Process every token of the step; return logits (S, vocab) for the sequences that sample, in order."""
        if self.graphs is not None and inputs.is_decode:
            try:
                return self.graphs.run(inputs)
            except CaptureError as exc:
                if self.cuda_graph_mode == "on":
                    raise
                log.warning("CUDA graphs off for this engine (cuda_graph_mode auto), decode steps run eagerly: %s",
                            exc)
                self.graphs = None
        input_ids, meta, logits_index = self._step_tensors(inputs)
        native = self.native_layers if meta.decode_columns is not None else None  # a decode step: one compiled call
        return self.model(input_ids, meta, self.kv.layers, logits_index, native)

    def _step_tensors(self, inputs: StepInputs) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        return model_step_tensors(self.model, inputs, self.device, self.attention_kernel == "paged",
                                  self.causal_prefill)

    def _forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, logits_index: torch.Tensor) -> torch.Tensor:
        """The Python layers over this runner's KV pools (what a CUDA graph captures)."""
        return self.model(input_ids, meta, self.kv.layers, logits_index)

    def close(self) -> None:
        """Nothing outlives an in-process runner (backend/model/parallel/driver.py's has worker processes)."""
