"""A decode step's decoder layers in one compiled call (decode_layers.cpp), where every layer can take it.

decode_layers.cpp runs the ATen operations of backend/model/decoder.py's layers in their order on the same tensors,
so its output equals the Python layers' bit for bit (the rotary embedding and the K/V writes as one pass with the
same float operations, and the norms, residual adds and SiLU(gate) * up as row_ops.cpp's passes in ATen's order where
they give ATen's bits: norm_rows_exact(), silu_rows_exact()); what it saves is Python: ~40 operator calls and 4-6 module
calls per layer, about a quarter of the demo model's batch-1 step (perf/ISSUE16.md "Decoder layers in one call").
Where the compiled layers run, the model's other float32 norms (the final one, the prefill's) take the one-pass form
too (one_pass_norms), and so do the prefill's rotary and K/V writes (one_pass_rotary) and its SiLU MLPs beside bf16
linears (one_pass_mlps).
It serves decode steps run by the paged attention kernel (float32 queries on CPU) on oneDNN-prepacked linears
(float32, or bfloat16 beside the float32 activations, with a bf16 KV pool; products of up to 16 rows on the GEMV's
copies where PrepackedLinear holds them, as its forward does: bf16_gemv.py); anything else (prefill chunks,
quantized linears, FP8 KV pools, other dtypes or devices) keeps the Python layers.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from backend.kernel_choices import DECODE_LAYERS
from backend.model.causal_lm import CausalLM
from backend.model.decoder import AttentionMetadata, DecoderLayer, RMSNorm
from backend.model.kernels.build import load
from backend.model.prepacked_linear import PrepackedLinear

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # decode_layers.cpp's activation codes
_ABSENT = torch.empty(0)


def one_pass_norms(model: CausalLM, rms_norm_rows, grain: int) -> int:
    """Give the model's float32 norms over rows shorter than ATen's grain (at::internal::GRAIN_SIZE, from the
    extension: a lone row that long may be summed in parts between threads) row_ops.cpp's one-pass form
    (RMSNorm.one_pass) where it gives ATen's bits (the caller asks norm_rows_exact()): the final norm of every step and
    the prefill's norms, which the compiled decode layers do not run. Returns how many norms took it.

    Why: the final norm's six ATen operations took ~0.1-0.2 ms of a 125M decode step on caches the step's weights had
    just evicted; a 2,048-token prefill's 24 norms ~0.3 ms each (perf/ISSUE16.md)."""
    norms = [m for m in model.modules() if isinstance(m, RMSNorm) and m.weight.dtype == torch.float32
             and m.weight.is_contiguous() and m.weight.numel() < grain]
    for norm in norms:
        norm.one_pass = rms_norm_rows
    return len(norms)


def one_pass_rotary(model: CausalLM, rotate_and_store) -> int:
    """Give the attention of each layer without q / k norms decode_layers.cpp's one pass of rotary and K/V writes
    (Attention.rotate_store; the same arithmetic, so no exactness to ask): a prefill's, which the compiled decode
    layers do not run. Returns how many layers took it.

    Why: a 2,048-token prefill of the 125M model spent ~20 ms of its ~630 in the rotary's 5 ATen operations a layer,
    the K/V rows' rounding and their index_copy_ (perf/ISSUE16.md)."""
    attentions = [layer.attention for layer in model.transformer.layers if layer.attention.q_layernorm is None]
    for attention in attentions:
        attention.rotate_store = rotate_and_store
    return len(attentions)


def one_pass_mlps(model: CausalLM, silu_mul_bf16_rows) -> int:
    """Give each SiLU MLP with bf16 linears beside float32 activations (fc | gate fused, both PrepackedLinears in
    bf16) row_ops.cpp's one pass from the bf16 product to proj's bf16 input (GatedMLP.act_mul_rows), where it gives
    ATen's bits (the caller asks silu_rows_exact()): a prefill's MLPs, which the compiled decode layers do not run.
    Returns how many MLPs took it.

    Why: a 2,048-token prefill of the 125M model widened its (T, 6,144) bf16 products, ran SiLU and the product in
    float32 and rounded the (T, 3,072) result back, ~35 ms of its ~650 (perf/ISSUE16.md)."""
    mlps = [layer.mlp for layer in model.transformer.layers
            if model.features.mlp.activation == "silu" and not layer.mlp.fused
            and all(isinstance(m, PrepackedLinear) and m.dtype == torch.bfloat16
                    for m in (layer.mlp.fc_gate, layer.mlp.proj))]
    for mlp in mlps:
        mlp.act_mul_rows = silu_mul_bf16_rows
    return len(mlps)


def _layer_unsupported(layer: DecoderLayer) -> str | None:
    attn, mlp = layer.attention, layer.mlp
    linears = {"qkv": attn.qkv, "dense": attn.dense, "proj": mlp.proj, "fc": mlp.fc if mlp.fused else mlp.fc_gate}
    for name, module in linears.items():
        if not isinstance(module, PrepackedLinear):
            return f"its {name} linear is a {type(module).__name__}, not a oneDNN-prepacked float linear"
        if name != "qkv" and module.bias is not None:
            return f"its {name} linear has a bias"
    return None


def unsupported(model: CausalLM, kv_layers: list) -> str | None:
    """Why the compiled layers cannot run this model's decode steps (None: they can)."""
    if next(model.parameters()).device.type != "cpu":
        return "the compiled decoder layers run on CPU only"
    if model.features.mlp.activation not in ACTIVATIONS:
        return f"its MLP activation {model.features.mlp.activation!r} has no compiled counterpart"
    for i, layer in enumerate(model.transformer.layers):
        if (reason := _layer_unsupported(layer)) is not None:
            return f"layer {i}: {reason}"
    norms = [m for m in model.transformer.layers.modules() if isinstance(m, RMSNorm)]
    if any(n.weight.dtype != torch.float32 for n in norms):
        return "the compiled decoder layers run float32 only"
    if len({n.eps for n in norms}) != 1:
        return "its norms differ in epsilon"
    for k, v in kv_layers:
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dtype == v.dtype
                and k.dtype in (torch.float32, torch.bfloat16)):
            return "its KV cache is not a float32 or bfloat16 pool (FP8 KV pools keep the Python layers)"
    return None


class NativeDecodeLayers:
    """Runs CausalLM.run_layers' work for a decode step read by the paged kernel (meta.decode_columns set)."""

    def __init__(self, model: CausalLM) -> None:
        f = model.features
        layers = model.transformer.layers
        self.windows = [layer.attention.window for layer in layers]
        self.collect_weights(layers)
        a = f.attention
        self.dims = [a.n_heads, a.n_kv, a.head_dim, int(f.norm_weight_in_float32), ACTIVATIONS[f.mlp.activation],
                     int(f.mlp.fused), int(f.sandwich_norms)]
        self.scalars = [a.scale, a.softcap or 0.0, layers[0].input_layernorm.eps]
        self.kernels = load()
        one_pass_rotary(model, self.kernels.rotate_and_store)
        if self.kernels.norm_rows_exact():
            one_pass_norms(model, self.kernels.rms_norm_rows, self.kernels.aten_grain_size())
        if self.kernels.silu_rows_exact():
            one_pass_mlps(model, self.kernels.silu_mul_bf16_rows)

    def collect_weights(self, layers: Iterable[DecoderLayer]) -> None:
        """self.weights: every layer's tensors in the compiled call's order. The list holds the tensors themselves,
        so it is collected again where a linear's GEMV copy is replaced (an A/B of two copies of the same values)."""
        self.weights = [t for layer in layers for t in self._layer_tensors(layer)]

    @staticmethod
    def _layer_tensors(layer: DecoderLayer) -> list[torch.Tensor]:
        """decode_layers.cpp's per-layer order: input norm, qkv (+ bias), q / k norms, dense, post norm, pre / post
        MLP norms, fc (fc | gate, or up | gate), proj, then the GEMV's copies of qkv, dense, fc and proj; _ABSENT
        where the layer has none."""
        attn, mlp = layer.attention, layer.mlp

        def norm(module: RMSNorm | None) -> torch.Tensor:
            return _ABSENT if module is None else module.weight.detach()

        fc = mlp.fc if mlp.fused else mlp.fc_gate
        linears = (attn.qkv, attn.dense, fc, mlp.proj)
        return [norm(layer.input_layernorm), attn.qkv.packed, _ABSENT if attn.qkv.bias is None else attn.qkv.bias,
                norm(attn.q_layernorm), norm(attn.k_layernorm), attn.dense.packed, norm(layer.post_layernorm),
                norm(layer.pre_feedforward_layernorm), norm(layer.post_feedforward_layernorm), fc.packed,
                mlp.proj.packed, *(_ABSENT if lin.gemv is None else lin.gemv for lin in linears)]

    def __call__(self, x: torch.Tensor, meta: AttentionMetadata,
                 kv_layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x (B, hidden) -> (B, hidden) after every layer."""
        columns = [meta.decode_columns[w] for w in self.windows]
        return self.kernels.decode_layers(
            x, self.weights, [k for k, _ in kv_layers], [v for _, v in kv_layers], [c[0] for c in columns],
            [c[1] for c in columns], meta.slot_mapping, meta.cos, meta.sin_signed, meta.context_slots, self.dims,
            self.scalars)


def resolve_decode_layers(choice: str, model: CausalLM, kv_layers: list,
                          attention_kernel: str) -> NativeDecodeLayers | None:
    """"python" -> None; "native" -> the compiled layers or ValueError naming why not; "auto" -> the compiled
    layers where they run (decode steps of the paged attention kernel), else None."""
    if choice not in DECODE_LAYERS:
        raise ValueError(f"decode_layers must be one of {DECODE_LAYERS}, got {choice!r}")
    if choice == "python":
        return None
    reason = ("decode attention is not the paged kernel's (attention_kernel resolved to "
              f"{attention_kernel!r})") if attention_kernel != "paged" else unsupported(model, kv_layers)
    if reason is None:  # the kernels built: the paged attention kernel resolved
        return NativeDecodeLayers(model)
    if choice == "native":
        raise ValueError(f"decode_layers 'native' is unavailable: {reason}")
    return None
