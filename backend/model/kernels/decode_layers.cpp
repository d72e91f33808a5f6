// Every decoder layer of a decode step in one call: the ATen operations backend/model/decoder.py runs, in the same
// order on the same tensors, so the result is bit for bit the Python layers' (tests/unit/model/test_decode_layers.py),
// without ~40 Python operator calls and 4-6 module calls per layer (about a quarter of the demo model's batch-1 step,
// perf/ISSUE16.md). The rotary embedding and the K/V writes run as one hand-written pass with the same float
// operations (rotate_and_store: 0.95x the whole decode step at batch 16), and so do the norms, the residual adds and
// SiLU(gate) * up where row_ops.cpp reproduces ATen's order (RowOps). Float32 activations on CPU, linears
// prepacked for oneDNN (prepacked_linear.py: float32, or bfloat16 beside float32 activations), decode attention by
// paged_decode.cpp; backend/model/kernels/decode_layers.py decides where it applies and lays out its arguments.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace {

// Per layer, `weights` holds kPerLayer tensors in this order; an empty tensor stands for an absent one. The *Gemv
// slots: the GEMV's copy of the linear's weight (kernels/gemv.py), where PrepackedLinear holds one.
enum Slot : int64_t {
  kInputNorm, kQkv, kQkvBias, kQNorm, kKNorm, kDense, kPostNorm, kPreMlpNorm, kPostMlpNorm, kFc, kProj,
  kQkvGemv, kDenseGemv, kFcGemv, kProjGemv, kPerLayer
};

bool present(const torch::Tensor& t) { return t.defined() && t.numel() > 0; }

// x (T, in) @ a oneDNN-packed weight (+ bias): prepacked_linear.PrepackedLinear.forward's call, which rounds x to
// the packed weight's dtype (bf16 linears beside float32 activations) and widens the product back; up to
// kGemvMaxRows rows on the GEMV's copy where there is one, as PrepackedLinear.forward does: the packed weight's
// dtype is the linear's, which picks the kernel (bf16 linears: bf16_gemv.cpp over an interleaved copy; float32
// ones: f32_gemv.cpp over a row-major float32 or bf16 one).
// then: the GEMV copy of the linear that runs next (bf16 ones ask for its first strips ahead, bf16_gemv.cpp); ahead:
// pool rows a bf16 GEMV asks for meanwhile (pool_lines.h), or nullptr.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                            const torch::Tensor& gemv, const torch::Tensor& then,
                            const PoolRowsAhead* ahead = nullptr) {
  if (x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && present(gemv)) {
    if (packed.scalar_type() == at::kFloat) return f32_gemv(x, gemv, bias);
    return bf16_gemv(x, gemv, bias, then.defined() && then.scalar_type() == at::kBFloat16 ? then : torch::Tensor(),
                     ahead);
  }
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

// rotary() on the q and k heads, the K/V rows' rounding to the pool's dtype and their index_copy_ into the pool,
// and q.contiguous(), in one pass over qkv (T, (H + 2 KV) d) instead of ~12 ATen operations and 5 temporaries
// (perf/ISSUE16.md, "Rotary and the K/V writes in one pass"). Each rotated element is rotary()'s arithmetic: x * cos
// and swapped * sin_signed, each rounded, then their sum, rounded (no fused multiply-add: fp-contract off here); the
// rounding to bf16 is c10's round-to-nearest-even, as ATen's conversion: the same bits as the ATen path. Returns q
// (T, H, d).
template <typename P>
__attribute__((optimize("fp-contract=off"))) void rotate_and_store_rows(
    const float* qkv, int64_t T, int64_t H, int64_t KV, int64_t d, int64_t rot, const float* cos, const float* sin,
    const int64_t* slots, P* k_pool, P* v_pool, float* q) {
  const int64_t half = rot / 2, width = (H + 2 * KV) * d;
  // a prefill's rows split between the threads (each row on its own: the same bits); a decode step's few on this one
  at::parallel_for(0, T, std::max<int64_t>(1, at::internal::GRAIN_SIZE / width), [&](int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const float* row = qkv + t * width;
    const float* c = cos + t * rot;
    const float* sn = sin + t * rot;
    P* k_row = k_pool + slots[t] * KV * d;
    P* v_row = v_pool + slots[t] * KV * d;
    for (int64_t h = 0; h < H + KV; ++h) {
      const float* x = row + h * d;
      float rotated[512];  // d <= 512 (checked)
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i] * c[i], b = x[i + half] * sn[i];
        rotated[i] = a + b;
      }
      for (int64_t i = half; i < rot; ++i) {
        const float a = x[i] * c[i], b = x[i - half] * sn[i];
        rotated[i] = a + b;
      }
      for (int64_t i = rot; i < d; ++i) rotated[i] = x[i];
      if (h < H) {
        std::copy(rotated, rotated + d, q + (t * H + h) * d);
      } else {
        P* dst = k_row + (h - H) * d;
        for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<P>(rotated[i]);
      }
    }
    const float* v = row + (H + KV) * d;
    for (int64_t i = 0; i < KV * d; ++i) v_row[i] = static_cast<P>(v[i]);
  }
  });
}

// rotate_and_store_rows where it applies, returning q (T, H, d): contiguous float32 qkv (T, (H + 2 KV) d), cos /
// sin_signed (T, rot) with an even rot <= d, a contiguous float32 or bf16 pool pair of (S, KV, d), head size up to
// 512; else nullopt, and the ATen operations run instead. The slots were checked against the pools once for every
// layer (check_slots).
std::optional<torch::Tensor> rotate_and_store(const torch::Tensor& qkv, int64_t H, int64_t KV, int64_t d,
                                              const torch::Tensor& cos, const torch::Tensor& sin_signed,
                                              const torch::Tensor& slots, const torch::Tensor& k_pool,
                                              const torch::Tensor& v_pool) {
  const auto pool = k_pool.scalar_type();
  const bool ok = qkv.is_contiguous() && cos.is_contiguous() && sin_signed.is_contiguous() && slots.is_contiguous() &&
                  k_pool.is_contiguous() && v_pool.is_contiguous() && d <= 512 && v_pool.scalar_type() == pool &&
                  (pool == at::kFloat || pool == at::kBFloat16) && cos.scalar_type() == at::kFloat &&
                  sin_signed.scalar_type() == at::kFloat && slots.scalar_type() == at::kLong &&
                  k_pool.dim() == 3 && k_pool.size(1) == KV && k_pool.size(2) == d && cos.dim() == 2 &&
                  cos.sizes() == sin_signed.sizes() && cos.size(0) == qkv.size(0) && cos.size(1) % 2 == 0 &&
                  cos.size(1) <= d && qkv.dim() == 2 && qkv.size(1) == (H + 2 * KV) * d;
  if (!ok) return std::nullopt;
  const int64_t T = qkv.size(0), rot = cos.size(-1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto q = torch::empty({T, H, d}, qkv.options());
  if (pool == at::kBFloat16) {
    rotate_and_store_rows<at::BFloat16>(qkv.data_ptr<float>(), T, H, KV, d, rot, cos.data_ptr<float>(),
                                        sin_signed.data_ptr<float>(), sp, k_pool.data_ptr<at::BFloat16>(),
                                        v_pool.data_ptr<at::BFloat16>(), q.data_ptr<float>());
  } else {
    rotate_and_store_rows<float>(qkv.data_ptr<float>(), T, H, KV, d, rot, cos.data_ptr<float>(),
                                 sin_signed.data_ptr<float>(), sp, k_pool.data_ptr<float>(), v_pool.data_ptr<float>(),
                                 q.data_ptr<float>());
  }
  return q;
}

// The K/V rows paged_decode will read for one layer (its pools, the step's context slots and that layer's column
// ranges), where the tensors are laid out as it requires; else nullopt (nothing asked for ahead).
std::optional<PoolRowsAhead> rows_ahead(const torch::Tensor& k_pool, const torch::Tensor& v_pool,
                                        const torch::Tensor& context_slots, const torch::Tensor& col_start,
                                        const torch::Tensor& col_end) {
  const auto is_index = [](const torch::Tensor& t, int64_t dims) {
    return t.dim() == dims && t.scalar_type() == at::kLong && t.is_contiguous();
  };
  if (!is_index(context_slots, 2) || !is_index(col_start, 1) || !is_index(col_end, 1) || k_pool.dim() != 3 ||
      !k_pool.is_contiguous() || !v_pool.is_contiguous() || v_pool.sizes() != k_pool.sizes() ||
      col_start.size(0) != context_slots.size(0) || col_end.size(0) != context_slots.size(0))
    return std::nullopt;
  return PoolRowsAhead{context_slots.data_ptr<int64_t>(), context_slots.size(0), context_slots.size(1),
                       col_start.data_ptr<int64_t>(), col_end.data_ptr<int64_t>(),
                       static_cast<const char*>(k_pool.data_ptr()), static_cast<const char*>(v_pool.data_ptr()),
                       k_pool.size(1) * k_pool.size(2) * static_cast<int64_t>(k_pool.element_size())};
}

// The last-level cache's size as the kernel reports it to this machine (/sys: what lscpu prints; glibc's sysconf
// reports the whole host's L3 inside a VM: 384 MB on the 32 MB EPYC VM of perf/ISSUE16.md), 32 MB where unknown.
int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
    int64_t n = 0;
    char unit = 0;
    if (!(in >> n) || n <= 0) return int64_t{32} << 20;
    in >> unit;
    return unit == 'M' ? n << 20 : unit == 'K' ? n << 10 : n;
  }();
  return bytes;
}

// Whether a step's GEMV weights outgrow the last-level cache: only then do the K/V rows it reads leave the caches
// between steps, and asking for them ahead pays (the demo model's, a few MB, stay: 1.007-1.020x its step with them).
bool weights_outgrow_cache(const std::vector<torch::Tensor>& weights, size_t layers) {
  int64_t bytes = 0;
  for (size_t l = 0; l < layers; ++l)
    for (const auto slot : {kQkvGemv, kDenseGemv, kFcGemv, kProjGemv})
      if (present(weights[l * kPerLayer + slot])) bytes += weights[l * kPerLayer + slot].nbytes();
  return bytes > last_level_cache_bytes();
}

// Every slot of the step inside every pool (rotate_and_store_rows writes there unchecked): once, before the layers.
void check_slots(const torch::Tensor& slots, const std::vector<torch::Tensor>& k_caches,
                 const std::vector<torch::Tensor>& v_caches) {
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kLong, "decode_layers: slot_mapping (T,) int64");
  int64_t rows = std::numeric_limits<int64_t>::max();
  for (const auto* pools : {&k_caches, &v_caches})
    for (const auto& pool : *pools) rows = std::min(rows, pool.size(0));
  const auto contiguous = slots.contiguous();
  const int64_t* sp = contiguous.data_ptr<int64_t>();
  for (int64_t t = 0; t < contiguous.size(0); ++t)
    TORCH_CHECK(0 <= sp[t] && sp[t] < rows, "decode_layers: slot outside the pool");
}

}  // namespace

// The lines rows_ahead's PoolLines walks for sequences [first, last), as (pool: 0 K, 1 V; byte offset from that
// pool's first byte) rows, for tests (tests/unit/model/test_pool_lines.py); (0, 2) where rows_ahead gives nothing.
torch::Tensor pool_lines(const torch::Tensor& k_pool, const torch::Tensor& v_pool, const torch::Tensor& context_slots,
                         const torch::Tensor& col_start, const torch::Tensor& col_end, int64_t first, int64_t last) {
  std::vector<int64_t> out;
  const auto rows = rows_ahead(k_pool, v_pool, context_slots, col_start, col_end);
  if (rows) {
    for (PoolLines lines(*rows, first, last); !lines.done();) {
      const bool in_v = lines.at_v();
      const char* at = lines.next();
      out.push_back(in_v ? 1 : 0);
      out.push_back(at - (in_v ? rows->v : rows->k));
    }
  }
  return torch::tensor(out, torch::kLong).view({-1, 2});
}

// bf16_gemv asking for those lines as it runs, for tests: the same bits as without.
torch::Tensor bf16_gemv_rows_ahead(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& k_pool,
                                   const torch::Tensor& v_pool, const torch::Tensor& context_slots,
                                   const torch::Tensor& col_start, const torch::Tensor& col_end) {
  const auto rows = rows_ahead(k_pool, v_pool, context_slots, col_start, col_end);
  TORCH_CHECK(rows.has_value(), "bf16_gemv_rows_ahead: the pools and indices as paged_decode takes them");
  return bf16_gemv(x, packed, torch::Tensor(), torch::Tensor(), &*rows);
}

// rotate_and_store for the Python layers (decoder.Attention.rotate_store: a prefill's rows, or any step the compiled
// layers do not take): the slots checked against the pools first; nullopt where it does not apply.
std::optional<torch::Tensor> rotate_and_store_rows_checked(const torch::Tensor& qkv, int64_t H, int64_t KV, int64_t d,
                                                           const torch::Tensor& cos, const torch::Tensor& sin_signed,
                                                           const torch::Tensor& slots, const torch::Tensor& k_pool,
                                                           const torch::Tensor& v_pool) {
  check_slots(slots, {k_pool}, {v_pool});
  return rotate_and_store(qkv, H, KV, d, cos, sin_signed, slots, k_pool, v_pool);
}

namespace {

// The same as rotate_and_store with ATen operations, with q / k norms (Qwen3, Gemma 3) where the model has them:
// decoder.Attention.forward's order. Returns q (T, H, d) contiguous.
torch::Tensor rotate_and_store_aten(const torch::Tensor& qkv, const torch::Tensor* w, int64_t T, int64_t H, int64_t KV,
                                    int64_t d, double eps, const torch::Tensor& cos, const torch::Tensor& sin_signed,
                                    const torch::Tensor& slots, const torch::Tensor& k_pool,
                                    const torch::Tensor& v_pool) {
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
  k_pool.index_copy_(0, slots, k.to(k_pool.scalar_type()));
  v_pool.index_copy_(0, slots, v.to(v_pool.scalar_type()));
  return q.contiguous();
}

torch::Tensor activation(const torch::Tensor& x, int64_t kind) {
  return kind == 0 ? at::silu(x) : at::gelu(x, "tanh");
}

// The norms, the residual adds before them and SiLU(gate) * up: row_ops.cpp's one-pass forms where they give ATen's
// bits (norms: where ATen sums in its AVX2 order, SiLU: silu_rows_exact(); rows shorter than ATen's grain: a
// lone row of the grain or more may be summed in two passes between threads, which row_ops.cpp does not follow), the
// ATen operations elsewhere.
struct RowOps {
  bool fused;  // the norms
  bool fused_silu;
  double eps;
  bool weight_f32;

  bool one_pass(const torch::Tensor& x, const torch::Tensor& w) const {
    return fused && x.stride(1) == 1 && w.scalar_type() == at::kFloat && w.is_contiguous();
  }
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& w) const {
    return one_pass(x, w) ? rms_norm_rows(x, w, eps) : rms_norm(x, w, eps, weight_f32);
  }
  // (x + delta, its norm)
  std::pair<torch::Tensor, torch::Tensor> add_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                   const torch::Tensor& w) const {
    if (one_pass(x, w) && delta.stride(1) == 1) {
      auto both = add_rms_norm_rows(x, delta, w, eps);
      return {both[0], both[1]};
    }
    auto sum = x + delta;
    return {sum, rms_norm(sum, w, eps, weight_f32)};
  }
  // halves (T, 2 I) -> act(gate) * up; gate the second half when fused (Phi-3's [up | gate]), else the first
  torch::Tensor gated(const torch::Tensor& fc, int64_t kind, bool fused_mlp) const {
    auto halves = fc.chunk(2, -1);
    const auto& gate = fused_mlp ? halves[1] : halves[0];
    const auto& up = fused_mlp ? halves[0] : halves[1];
    if (fused_silu && kind == 0 && fc.stride(1) == 1) return silu_mul_rows(gate, up);
    return fused_mlp ? up * activation(gate, kind) : activation(gate, kind) * up;
  }
};

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
  check_slots(slot_mapping, k_caches, v_caches);
  const bool short_rows = x.size(1) < at::internal::GRAIN_SIZE;
  const RowOps rows{norm_rows_exact() && short_rows, silu_rows_exact() && short_rows, eps, weight_f32};
  const bool ask_ahead = weights_outgrow_cache(weights, layers);
  torch::Tensor pending;  // the last layer's MLP output, added to x with the next layer's input norm
  for (size_t l = 0; l < layers; ++l) {
    const torch::Tensor* w = &weights[l * kPerLayer];
    torch::Tensor normed;
    if (pending.defined())
      std::tie(x, normed) = rows.add_norm(x, pending, w[kInputNorm]);
    else
      normed = rows.norm(x, w[kInputNorm]);
    // Attention: qkv (T, (H + 2 KV) d) = q heads, k heads, v heads.
    auto qkv = packed_linear(normed, w[kQkv], w[kQkvBias], w[kQkvGemv], w[kDenseGemv]);
    // q (T, H, d), rotated; the step's K/V rows written to the pools
    std::optional<torch::Tensor> fast;
    if (!present(w[kQNorm]))
      fast = rotate_and_store(qkv, H, KV, d, cos, sin_signed, slot_mapping, k_caches[l], v_caches[l]);
    const auto q = fast ? *fast
                        : rotate_and_store_aten(qkv, w, T, H, KV, d, eps, cos, sin_signed, slot_mapping, k_caches[l],
                                                v_caches[l]);
    auto attn = paged_decode(q, k_caches[l], v_caches[l], context_slots, col_starts[l], col_ends[l], scale, softcap);
    attn = packed_linear(attn.view({T, H * d}), w[kDense], torch::Tensor(), w[kDenseGemv], w[kFcGemv]);
    // MLP: fc holds [fc | gate] (HF gate_proj | up_proj) rows, or [up | gate] when fused (Phi-3).
    torch::Tensor mlp_in;
    if (sandwich) {
      x = x + rows.norm(attn, w[kPostNorm]);
      mlp_in = rows.norm(x, w[kPreMlpNorm]);
    } else {
      std::tie(x, mlp_in) = rows.add_norm(x, attn, w[kPostNorm]);
    }
    auto hidden = rows.gated(packed_linear(mlp_in, w[kFc], torch::Tensor(), w[kFcGemv], w[kProjGemv]), dims[4],
                             fused_mlp);
    const auto next_qkv = l + 1 < layers ? weights[(l + 1) * kPerLayer + kQkvGemv] : torch::Tensor();
    // proj asks for the next layer's K/V rows while it runs (pool_lines.h says why there)
    std::optional<PoolRowsAhead> ahead;
    if (ask_ahead && l + 1 < layers)
      ahead = rows_ahead(k_caches[l + 1], v_caches[l + 1], context_slots, col_starts[l + 1], col_ends[l + 1]);
    auto mlp = packed_linear(hidden, w[kProj], torch::Tensor(), w[kProjGemv], next_qkv, ahead ? &*ahead : nullptr);
    pending = sandwich ? rows.norm(mlp, w[kPostMlpNorm]) : mlp;
  }
  if (pending.defined()) x = x + pending;
  return x;
}
