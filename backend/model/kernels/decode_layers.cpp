// Every decoder layer of a decode step in one call: the ATen operations backend/model/decoder.py runs, in the same
// order on the same tensors, so the result is bit for bit the Python layers' (tests/unit/model/test_decode_layers.py),
// without ~40 Python operator calls and 4-6 module calls per layer (about a quarter of the demo model's batch-1 step,
// perf/ISSUE16.md). Float32 activations on CPU, linears prepacked for oneDNN (prepacked_linear.py: float32, or
// bfloat16 beside float32 activations), decode attention by paged_decode.cpp; backend/model/kernels/decode_layers.py
// decides where it applies and lays out its arguments.
#include "kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace {

// Per layer, `weights` holds kPerLayer tensors in this order; an empty tensor stands for an absent one. The *Gemv
// slots: the linear's weight interleaved for the GEMV (bf16_gemv.cpp), where PrepackedLinear holds one.
enum Slot : int64_t {
  kInputNorm, kQkv, kQkvBias, kQNorm, kKNorm, kDense, kPostNorm, kPreMlpNorm, kPostMlpNorm, kFc, kProj,
  kQkvGemv, kDenseGemv, kFcGemv, kProjGemv, kPerLayer
};

bool present(const torch::Tensor& t) { return t.defined() && t.numel() > 0; }

// x (T, in) @ a oneDNN-packed weight (+ bias): prepacked_linear.PrepackedLinear.forward's call, which rounds x to
// the packed weight's dtype (bf16 linears beside float32 activations) and widens the product back; up to
// kGemvMaxRows rows on the GEMV's interleaved copy where there is one, as PrepackedLinear.forward does.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                            const torch::Tensor& gemv) {
  if (x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && present(gemv)) return bf16_gemv(x, gemv, bias);
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const bool cast = packed.scalar_type() != x.scalar_type();
  torch::jit::Stack stack{cast ? x.to(packed.scalar_type()) : x, packed,
                          present(bias) ? c10::IValue(bias) : c10::IValue(), std::string("none"),
                          c10::List<std::optional<c10::Scalar>>(), std::string("")};
  op.callBoxed(stack);
  return cast ? stack[0].toTensor().to(x.scalar_type()) : stack[0].toTensor();
}

// decoder.RMSNorm.forward in float32 (its .float() / .to(dtype) are no-ops there).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps, bool weight_in_float32) {
  auto normed = x * at::rsqrt(x.pow(2).mean(-1, true) + eps);
  return weight_in_float32 ? normed * w : w * normed;
}

// decoder.apply_rotary: x (T, heads, d); cos / sin_signed (T, rot).
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin_signed) {
  const int64_t rot = cos.size(-1), half = rot / 2;
  auto x_rot = x.slice(-1, 0, rot);
  auto swapped = at::cat({x_rot.slice(-1, half, rot), x_rot.slice(-1, 0, half)}, -1);
  auto out = x_rot * cos.unsqueeze(1) + swapped * sin_signed.unsqueeze(1);
  return x.size(-1) == rot ? out : at::cat({out, x.slice(-1, rot)}, -1);
}

torch::Tensor activation(const torch::Tensor& x, int64_t kind) {
  return kind == 0 ? at::silu(x) : at::gelu(x, "tanh");
}

}  // namespace

// x (T, hidden) embeddings of a decode step (T sequences, one token each); weights: kPerLayer per layer;
// k_caches / v_caches (S, KV, d) per layer; col_starts / col_ends (T,) per layer: its window's context columns;
// slot_mapping (T,); cos / sin_signed (T, rot); context_slots (T, L).
// dims: heads, kv heads, head dim, norm weight in float32 (0/1), activation (0 silu, 1 gelu tanh), fused gate/up
// (0/1), sandwich norms (0/1). scalars: attention scale, soft cap (0: none), norm eps. Returns (T, hidden).
torch::Tensor decode_layers(torch::Tensor x, const std::vector<torch::Tensor>& weights,
                            const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
                            const std::vector<torch::Tensor>& col_starts, const std::vector<torch::Tensor>& col_ends,
                            const torch::Tensor& slot_mapping, const torch::Tensor& cos,
                            const torch::Tensor& sin_signed, const torch::Tensor& context_slots,
                            const std::vector<int64_t>& dims, const std::vector<double>& scalars) {
  const size_t layers = k_caches.size();
  TORCH_CHECK(dims.size() == 7 && scalars.size() == 3, "decode_layers: dims / scalars");
  TORCH_CHECK(weights.size() == layers * kPerLayer && v_caches.size() == layers && col_starts.size() == layers &&
                  col_ends.size() == layers, "decode_layers: per-layer argument counts");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "decode_layers: x (T, hidden) float32");
  const int64_t T = x.size(0), H = dims[0], KV = dims[1], d = dims[2];
  const bool weight_f32 = dims[3] != 0, fused_mlp = dims[5] != 0, sandwich = dims[6] != 0;
  const double scale = scalars[0], softcap = scalars[1], eps = scalars[2];
  TORCH_CHECK(slot_mapping.size(0) == T && context_slots.size(0) == T, "decode_layers: one new token per sequence");
  for (size_t l = 0; l < layers; ++l) {
    const torch::Tensor* w = &weights[l * kPerLayer];
    // Attention: qkv (T, (H + 2 KV) d) = q heads, k heads, v heads.
    auto qkv = packed_linear(rms_norm(x, w[kInputNorm], eps, weight_f32), w[kQkv], w[kQkvBias], w[kQkvGemv]);
    auto qk = qkv.slice(1, 0, (H + KV) * d).view({T, H + KV, d});
    torch::Tensor q, k;
    if (present(w[kQNorm])) {
      q = rotary(rms_norm(qk.slice(1, 0, H), w[kQNorm], eps, false), cos, sin_signed);
      k = rotary(rms_norm(qk.slice(1, H), w[kKNorm], eps, false), cos, sin_signed);
    } else {
      auto rotated = rotary(qk, cos, sin_signed);
      q = rotated.slice(1, 0, H);
      k = rotated.slice(1, H);
    }
    auto v = qkv.slice(1, (H + KV) * d).view({T, KV, d});
    // K/V rows rounded to the pool's dtype (bf16 pools beside bf16 linears), as Attention.forward does
    k_caches[l].index_copy_(0, slot_mapping, k.to(k_caches[l].scalar_type()));
    v_caches[l].index_copy_(0, slot_mapping, v.to(v_caches[l].scalar_type()));
    auto attn = paged_decode(q.contiguous(), k_caches[l], v_caches[l], context_slots, col_starts[l], col_ends[l],
                             scale, softcap);
    attn = packed_linear(attn.view({T, H * d}), w[kDense], torch::Tensor(), w[kDenseGemv]);
    // MLP: fc holds [fc | gate] (HF gate_proj | up_proj) rows, or [up | gate] when fused (Phi-3).
    torch::Tensor mlp_in;
    if (sandwich) {
      x = x + rms_norm(attn, w[kPostNorm], eps, weight_f32);
      mlp_in = rms_norm(x, w[kPreMlpNorm], eps, weight_f32);
    } else {
      x = x + attn;
      mlp_in = rms_norm(x, w[kPostNorm], eps, weight_f32);
    }
    auto halves = packed_linear(mlp_in, w[kFc], torch::Tensor(), w[kFcGemv]).chunk(2, -1);
    auto hidden = fused_mlp ? halves[0] * activation(halves[1], dims[4]) : activation(halves[0], dims[4]) * halves[1];
    auto mlp = packed_linear(hidden, w[kProj], torch::Tensor(), w[kProjGemv]);
    x = x + (sandwich ? rms_norm(mlp, w[kPostMlpNorm], eps, weight_f32) : mlp);
  }
  return x;
}
