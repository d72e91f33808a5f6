"""The decoder over a flat batch of tokens with a paged KV cache, built from DecoderFeatures (backend/model/features.py).

The model knows nothing of batching policy, parallelism or quantization: it takes the tokens of this step
(prefill chunks and decode tokens of many sequences, concatenated) and an AttentionMetadata that says where
their K/V go in the cache, which cached positions each query may see (per sliding window), and each token's
rotary cos/sin. Parameter names follow the TensorRT-LLM checkpoint (transformer.layers.N.attention.qkv,
mlp.fc/gate/proj, ...; backend/formats/checkpoint_tensors.py), so a checkpoint loads as is.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from backend.model.features import AttentionFeatures, DecoderFeatures, MlpFeatures
from backend.model.kernels.causal_prefill import causal_prefill
from backend.model.kernels.paged_decode import paged_decode


@dataclass
class AttentionMetadata:
    """Where this step's tokens sit, built once per step and shared by every layer.

    T = tokens this step, B = sequences, Q = most new tokens of one sequence, L = longest context window kept
    (cached + new; a sequence's context starts at its ctx_start, see StepInputs).
    """

    slot_mapping: torch.Tensor  # (T,) cache slot receiving each new token's K/V
    query_index: torch.Tensor  # (B, Q) flat token index of each sequence's new tokens, padded with 0
    query_flat: torch.Tensor  # (T,) index of each flat token in the padded (B * Q) layout
    context_slots: torch.Tensor  # (B, L) cache slot of each context position, padded with 0
    masks: Mapping[int | None, torch.Tensor]  # window (None: full) -> (B, 1, Q, L) bool: query may attend to key
    cos: torch.Tensor  # (T, rotary_dim) rotary cos at each token's position, activations' dtype
    sin_signed: torch.Tensor  # (T, rotary_dim) rotary sin, first half negated (rotate-half's sign folded in)
    decode_only: bool = False  # every sequence has one new token (Q == 1, T == B): no padded query layout needed
    # Decode steps run by the paged kernel (backend/model/kernels/): window -> ((B,), (B,)) int64, the first and
    # past-the-last context column each sequence's query attends to; None: gather + SDPA with `masks`.
    decode_columns: dict[int | None, tuple[torch.Tensor, torch.Tensor]] | None = None
    # Windows whose mask is plain top-left causal (every sequence's context is its new tokens, from column 0, and the
    # window does not cut it): SDPA's is_causal skips the blocks above the diagonal, the same result bit for bit.
    causal: frozenset[int | None] = frozenset()
    # Steps whose causal windows the compiled prefill kernel runs (backend/model/kernels/causal_prefill.py): (B, 2)
    # int64, each sequence's first flat token and new-token count; None: SDPA with is_causal.
    causal_seqs: torch.Tensor | None = None
    # A step mixing decode tokens with prompts (in-flight batching): ((T_g,) flat token indices, the metadata of just
    # those sequences) per group, decode sequences and prefilling ones, each attended on its own. Padded together,
    # every decoding sequence would carry the longest prompt's Q query rows: a 1,024-token prompt beside 15 decoding
    # sequences took 5.6 s a step instead of 0.7 (perf/ISSUE16.md). None: one group.
    parts: list[tuple[torch.Tensor, AttentionMetadata]] | None = None


class RMSNorm(nn.Module):
    """Normalise in float32 (HF's Llama and Gemma norms). Gemma checkpoints store 1 + w (TRT-LLM's converter
    adds the 1), so both multiply by the stored weight; Gemma in float32 before the cast, Llama after it."""

    def __init__(self, dim: int, eps: float, weight_in_float32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.weight_in_float32 = eps, weight_in_float32
        # (T, dim) float32 rows, weight, eps -> the same norm's bits in one pass instead of six ATen operations
        # (backend/model/kernels/row_ops.cpp; set where it gives ATen's bits: kernels/decode_layers.py); None: ATen.
        # In float32 both weight orders are one product: w * (x * r) == (x * r) * w.
        self.one_pass: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_pass is not None and x.dim() == 2 and x.dtype == torch.float32 and x.stride(-1) == 1:
            return self.one_pass(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_float32:
            return (x * self.weight.float()).to(dtype)
        return self.weight * x.to(dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """(T, rot) sin -> [-sin[:half], sin[half:]]: rotate_half(x) * sin == swap_halves(x) * signed_sin(sin) bit for
    bit ((-a) * b == a * (-b) in IEEE arithmetic), one negation per step instead of one per layer. Steps get it from
    RotaryEmbedding.cos_signed_sin in one multiply; this form is the tests' reference for that."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim); cos/sin_signed (T, rot) broadcast over heads. The first rot channels are rotated
    GPT-NeoX style (halves swapped inside them), the rest pass through (partial rotary)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    swapped = torch.cat((x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = x_rot * cos[:, None, :] + swapped * sin_signed[:, None, :]
    return out if x_pass.shape[-1] == 0 else torch.cat((out, x_pass), dim=-1)


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache (slots, n_kv, head_dim), slots (B, L) -> (B, L, n_kv, head_dim). index_select copies whole rows: on
    CPU about 4x faster than advanced indexing (cache[slots]) at batch 16 x 192 positions (perf/ISSUE16.md)."""
    B, L = slots.shape
    return cache.index_select(0, slots.reshape(-1)).view(B, L, *cache.shape[1:])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           softcap: float | None, causal: bool = False) -> torch.Tensor:
    """q (B, H, Q, D), k/v (B, H_kv, L, D), mask (B, 1, Q, L) bool -> (B, H, Q, D). Soft-capping needs the scores
    themselves, so it runs the eager computation HF runs (scale, cap, mask, float32 softmax); otherwise SDPA, told
    is_causal where `causal` says the mask is top-left causal (Q == L: half the work of a long prompt's prefill)."""
    if softcap is None and causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


class Attention(nn.Module):
    def __init__(self, f: AttentionFeatures, window: int | None) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = f.n_heads, f.n_kv, f.head_dim
        self.scale, self.softcap, self.window = f.scale, f.softcap, window
        self.qkv = nn.Linear(f.hidden, (self.n_heads + 2 * self.n_kv) * self.head_dim, bias=f.qkv_bias)
        self.dense = nn.Linear(self.n_heads * self.head_dim, f.hidden, bias=False)
        if f.qk_norm:
            self.q_layernorm = RMSNorm(self.head_dim, f.norm_eps)
            self.k_layernorm = RMSNorm(self.head_dim, f.norm_eps)
        else:
            self.q_layernorm = self.k_layernorm = None
        # (qkv, H, KV, d, cos, sin_signed, slot_mapping, k_cache, v_cache) -> q (T, H, d) rotated, this step's K/V
        # rows rotated and rounded into the pools in one pass (the same bits: kernels/decode_layers.cpp's
        # rotate_and_store), or None where it does not apply; set by kernels/decode_layers.py's one_pass_rotary for
        # layers without q / k norms. None: the ATen operations.
        self.rotate_store: Callable[..., torch.Tensor | None] | None = None

    def _rotated_qk(self, qk: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """qk (T, n_heads + n_kv, d) -> q (T, n_heads, d), k (T, n_kv, d), rotary applied. Without q/k norms both
        rotate in one call (the same cos/sin per token): half the element-wise ops of a layer's rotary."""
        if self.q_layernorm is None:
            qk = apply_rotary(qk, meta.cos, meta.sin_signed)
            return qk[:, :self.n_heads], qk[:, self.n_heads:]
        q, k = self.q_layernorm(qk[:, :self.n_heads]), self.k_layernorm(qk[:, self.n_heads:])
        return apply_rotary(q, meta.cos, meta.sin_signed), apply_rotary(k, meta.cos, meta.sin_signed)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        # x (T, hidden); k_cache/v_cache (slots, n_kv, head_dim)
        T, d, H, KV = x.shape[0], self.head_dim, self.n_heads, self.n_kv
        qkv = self.qkv(x)  # (T, (H + 2 KV) * d): q heads, k heads, v heads
        q = None if self.rotate_store is None else self.rotate_store(
            qkv, H, KV, d, meta.cos, meta.sin_signed, meta.slot_mapping, k_cache, v_cache)
        if q is not None:  # this step's K/V rows as stored (T, KV, d), for the attention below
            k, v = k_cache.index_select(0, meta.slot_mapping), v_cache.index_select(0, meta.slot_mapping)
        else:
            q, k, v = self._store_kv(qkv, k_cache, v_cache, meta)
        if meta.parts is None:
            out = self._attend(q, k, v, k_cache, v_cache, meta)
        else:  # decode tokens and prompts, each group on its own (every K/V row is in the pool by now)
            out = q.new_empty(T, H, d)
            for tokens, part in meta.parts:
                out[tokens] = self._attend(q[tokens], k[tokens], v[tokens], k_cache, v_cache, part)
        return self.dense(out.reshape(T, H * d))  # (T, heads*dim) in token order

    def _store_kv(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv (T, (H + 2 KV) d) -> q (T, H, d) and k, v (T, KV, d) in the pools' dtype, rotated; k, v written to
        the pools."""
        T, d, H, KV = qkv.shape[0], self.head_dim, self.n_heads, self.n_kv
        q, k = self._rotated_qk(qkv[:, :(H + KV) * d].view(T, H + KV, d), meta)  # (T, H, d), (T, KV, d)
        v = qkv[:, (H + KV) * d:].view(T, KV, d)
        if k_cache.dtype != k.dtype:  # a bf16 pool beside bf16 linears: K/V rows rounded as the checkpoint's dtype
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache.index_copy_(0, meta.slot_mapping, k)  # cheaper than k_cache[slot_mapping] = k (no index_put_)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """q (T, H, d), this step's k/v (T, KV, d) in the pools' dtype -> (T, H, d) in flat token order."""
        H, d = q.shape[1:]
        B, Q = meta.query_index.shape
        if meta.decode_columns is not None and isinstance(k_cache, torch.Tensor):  # FP8 pools take the torch path
            first, stop = meta.decode_columns[self.window]
            return paged_decode(q, k_cache, v_cache, meta.context_slots, first, stop, self.scale, self.softcap)
        if (meta.causal_seqs is not None and self.window in meta.causal and self.softcap is None
                and k.dtype == torch.bfloat16 and q.dtype == torch.float32):
            # every sequence's keys are its own new tokens (k, v in flat token order): no gather, no padding
            return causal_prefill(q, k, v, meta.causal_seqs, self.scale)
        # (B, H, Q, d): a decode step's T tokens are its B sequences already
        q_pad = (q.view(B, 1, H, d) if meta.decode_only else q[meta.query_index]).transpose(1, 2)
        k_ctx = gather(k_cache, meta.context_slots).transpose(1, 2).to(q.dtype)  # (B, n_kv, L, head_dim)
        v_ctx = gather(v_cache, meta.context_slots).transpose(1, 2).to(q.dtype)  # (bf16 pools: widened, exact)
        out = attend(q_pad, k_ctx, v_ctx, meta.masks[self.window], self.scale, self.softcap,
                     self.window in meta.causal)
        out = out.transpose(1, 2).reshape(B * Q, H, d)
        return out if meta.decode_only else out[meta.query_flat]


_ACT = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
# Bytes of one MLP chunk's float32 (rows, 2 x intermediate) projection: 1-8 MiB measured, 4 kept (perf/ISSUE16.md,
# "The MLP in cache-sized row chunks during prefill").
MLP_CHUNK_BYTES = 4 << 20


def cache_rows(intermediate: int) -> int:
    """Rows of an MLP whose float32 (rows, 2 x intermediate) projection fits MLP_CHUNK_BYTES (at least 32)."""
    return max(32, MLP_CHUNK_BYTES // (2 * intermediate * 4))


def row_chunks(tokens: int, rows: int) -> int:
    """How many near-equal chunks of at most `rows` rows cover `tokens` (tensor_split: sizes differ by at most one,
    so no chunk is a sliver that a GEMM library would run with another kernel)."""
    return max(1, -(-tokens // rows))


class GatedMLP(nn.Module):
    """proj(act(fc(x)) * gate(x)); fused (Phi-3): fc holds [up | gate] rows, proj(up * act(gate))."""

    def __init__(self, f: MlpFeatures) -> None:
        super().__init__()
        self.act, self.fused = _ACT[f.activation], f.fused
        self.fc = nn.Linear(f.hidden, f.intermediate * (2 if f.fused else 1), bias=False)
        self.gate = None if f.fused else nn.Linear(f.hidden, f.intermediate, bias=False)  # HF up_proj
        self.proj = nn.Linear(f.intermediate, f.hidden, bias=False)  # HF down_proj
        # (2 * intermediate, hidden): fc and gate in one matmul; a PrepackedLinear once packed (prepacked_linear.py)
        self.fc_gate: torch.Tensor | nn.Module | None = None
        # (T, 2 I) [fc | gate] product in the linears' own dtype -> act(fc) * gate rounded to it, in one pass: bf16
        # linears beside float32 activations skip the widening of the product, the two ATen operations and the
        # rounding before proj (row_ops.cpp's silu_mul_bf16_rows, the same bits; set by
        # kernels/decode_layers.py's one_pass_mlps where it gives them); None: the ATen operations.
        self.act_mul_rows: Callable[[torch.Tensor], torch.Tensor] | None = None

    def fuse(self) -> None:
        """After loading: one matmul for both input projections (fewer, larger kernels: small batches on CPU are
        bound by per-call overhead). Only plain float linears fuse; modules swapped in afterwards (quantized
        ones, say) keep their own forward."""
        if self.fused or type(self.fc) is not nn.Linear or type(self.gate) is not nn.Linear:
            return
        self.fc_gate = torch.cat([self.fc.weight, self.gate.weight]).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (T, hidden). On CPU a long prefill runs in row chunks (cache_rows): each chunk's (rows, 2 x inter)
        # float32 intermediates stay in the caches instead of streaming (T, 2 x inter) through DRAM once for each
        # elementwise op (widening, activation, product, rounding). Rows are independent: each row's result is
        # unchanged, bit for bit with the float kernels (MKL, oneDNN float32 / bf16: test_mlp_chunks.py).
        chunks = row_chunks(x.shape[0], cache_rows(self.proj.in_features)) if x.device.type == "cpu" else 1
        if chunks == 1:
            return self._forward(x)
        return torch.cat([self._forward(part) for part in x.tensor_split(chunks)])

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            up, gate = self.fc(x).chunk(2, dim=-1)
            return self.proj(up * self.act(gate))
        if self.fc_gate is None:
            return self.proj(self.act(self.fc(x)) * self.gate(x))
        fused = self.fc_gate
        if self.act_mul_rows is not None and (both := fused.forward_unwidened(x)) is not None:
            return self.proj(self.act_mul_rows(both)).to(x.dtype)  # proj takes its own dtype as is
        fc, gate = (F.linear(x, fused) if isinstance(fused, torch.Tensor) else fused(x)).chunk(2, dim=-1)
        return self.proj(self.act(fc) * gate)


class DecoderLayer(nn.Module):
    """Pre-norm: x += attn(norm(x)); x += mlp(norm(x)). Sandwich (Gemma 2): x += post_layernorm(attn(norm(x)));
    x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))."""

    def __init__(self, f: DecoderFeatures, window: int | None) -> None:
        super().__init__()

        def norm() -> RMSNorm:
            return RMSNorm(f.attention.hidden, f.norm_eps, f.norm_weight_in_float32)

        self.input_layernorm = norm()
        self.attention = Attention(f.attention, window)
        self.post_layernorm = norm()
        self.pre_feedforward_layernorm = norm() if f.sandwich_norms else None
        self.post_feedforward_layernorm = norm() if f.sandwich_norms else None
        self.mlp = GatedMLP(f.mlp)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        attn = self.attention(self.input_layernorm(x), k_cache, v_cache, meta)
        if self.pre_feedforward_layernorm is None:
            x = x + attn
            return x + self.mlp(self.post_layernorm(x))
        x = x + self.post_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, f: DecoderFeatures) -> None:
        super().__init__()
        self.vocab_embedding = nn.Embedding(f.vocab_size, f.attention.hidden)
        self.layers = nn.ModuleList(DecoderLayer(f, w) for w in f.windows)
        self.ln_f = RMSNorm(f.attention.hidden, f.norm_eps, f.norm_weight_in_float32)
