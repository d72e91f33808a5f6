// The decoder layers' small float32 row operations in one pass each: RMS norm (6 ATen operations: pow, mean, add,
// rsqrt, two products), the residual add before it, and act(gate) * up for SiLU (2). Each is ATen's own arithmetic in
// ATen's order, so the bits are those of the ATen operations decoder.py runs (tests/unit/model/test_row_ops.py checks
// them against ATen), without their dispatches and temporaries: at batch 16 the demo model's step ran ~2 ms of such
// operations in 14 (perf/ISSUE16.md, "The norms and SiLU in one pass"). The norms follow ATen's AVX2 sum (8-float
// vectors), which torch's AVX-512 kernels run too (norm_rows_exact() checks that once); SiLU follows the kernel ATen
// runs, AVX2 or AVX-512 (silu_rows_exact(): the AVX-512 one checked once). decode_layers.cpp keeps the ATen
// operations where they are not exact.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/Version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <sleef.h>

namespace {

inline __m256 square8(const float* x) {
  const __m256 v = _mm256_loadu_ps(x);
  return _mm256_mul_ps(v, v);
}

// The sum of x[0, n)^2 as ATen's sum(x.pow(2), -1) adds it (SumKernel.cpp's cascade_sum, contiguous inner
// reduction): 8-float vectors read as rows of 4 (row_sum's ilp), each of the 4 summed in a cascade of 4 levels that
// carries every 16 rows up a level (multi_row_sum; 16 = 1 << level_power: max(4, CeilLog2(rows) / 4) is 4 up to 2^19
// rows, 5 above, which this order does not follow, so it refuses them); then the vectors
// left over, the 4 sums in order, the floats left over from 0, the 8 lanes in order. Squares rounded before the
// adds, as pow's output is: no fused multiply-adds (fp-contract off).
__attribute__((optimize("fp-contract=off"))) float sum_of_squares(const float* x, int64_t n) {
  if (n < 8) {  // fewer floats than a vector: scalar_inner_sum, row_sum's 4 sums of one row of 4, the rest, in order
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    const int64_t whole = n / 4 * 4;
    for (int64_t e = 0; e < whole; ++e) part[e] = x[e] * x[e];
    for (int64_t e = whole; e < n; ++e) {
      const float sq = x[e] * x[e];
      part[0] += sq;
    }
    return ((part[0] + part[1]) + part[2]) + part[3];
  }
  constexpr int64_t kLevels = 4, kStep = 16, kPower = 4;
  const int64_t vecs = n / 8, rows = vecs / 4;
  TORCH_CHECK(rows <= (int64_t{1} << 19), "row_ops: rows of ", n, " floats are longer than this sum reproduces");
  __m256 acc[kLevels][4];
  for (auto& level : acc)
    for (auto& a : level) a = _mm256_setzero_ps();
  int64_t i = 0;
  while (i + kStep <= rows) {
    for (int64_t j = 0; j < kStep; ++j, ++i)
      for (int64_t k = 0; k < 4; ++k) acc[0][k] = _mm256_add_ps(acc[0][k], square8(x + (4 * i + k) * 8));
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < 4; ++k) {
        acc[j][k] = _mm256_add_ps(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = _mm256_setzero_ps();
      }
      if ((i & ((kStep - 1) << (j * kPower))) != 0) break;
    }
  }
  for (; i < rows; ++i)
    for (int64_t k = 0; k < 4; ++k) acc[0][k] = _mm256_add_ps(acc[0][k], square8(x + (4 * i + k) * 8));
  for (int64_t j = 1; j < kLevels; ++j)
    for (int64_t k = 0; k < 4; ++k) acc[0][k] = _mm256_add_ps(acc[0][k], acc[j][k]);
  for (int64_t v = rows * 4; v < vecs; ++v) acc[0][0] = _mm256_add_ps(acc[0][0], square8(x + v * 8));
  for (int64_t k = 1; k < 4; ++k) acc[0][0] = _mm256_add_ps(acc[0][0], acc[0][k]);
  float total = 0.f;
  for (int64_t e = vecs * 8; e < n; ++e) {
    const float sq = x[e] * x[e];
    total += sq;
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0][0]);
  for (float lane : lanes) total += lane;
  return total;
}

// out[0, n) = w * (x * rsqrt(mean(x^2) + eps)): mean as ATen's CPU mean (the sum, then / n), eps rounded to float
// as a float tensor's scalar add rounds it, rsqrt as 1 / sqrt (ATen's scalar and AVX2 kernels alike).
__attribute__((optimize("fp-contract=off"))) void norm_row(const float* x, const float* w, int64_t n, float eps,
                                                          float* out) {
  const float mean = sum_of_squares(x, n) / static_cast<float>(n);
  const float r = 1.f / std::sqrt(mean + eps);
  const __m256 rv = _mm256_set1_ps(r);
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    _mm256_storeu_ps(out + e, _mm256_mul_ps(_mm256_loadu_ps(w + e), _mm256_mul_ps(_mm256_loadu_ps(x + e), rv)));
  for (; e < n; ++e) out[e] = w[e] * (x[e] * r);
}

// out[from, to) = silu(gate) * up, silu as ATen's AVX2 kernel computes it: x / (1 + exp(-x)) with Sleef's exp over
// 16-float pairs of vectors from `from`, the floats left over with the scalar expf (its vectorized_loop's tail).
void silu_mul_span(const float* gate, const float* up, int64_t from, int64_t to, float* out) {
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  int64_t e = from;
  for (; e + 16 <= to; e += 16)
    for (int64_t h = e; h < e + 16; h += 8) {
      const __m256 g = _mm256_loadu_ps(gate + h);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, Sleef_expf8_u10(_mm256_xor_ps(sign, g))));
      _mm256_storeu_ps(out + h, _mm256_mul_ps(s, _mm256_loadu_ps(up + h)));
    }
  for (; e < to; ++e) out[e] = gate[e] / (1.f + std::exp(-gate[e])) * up[e];
}

#if defined(__AVX512F__)
// silu_mul_span as ATen's AVX-512 kernel computes SiLU (vec512_float.h: 16-float vectors, exp by Sleef_expf16_u10),
// over 32-float pairs of vectors, the floats left over with the scalar expf.
void silu_mul_span16(const float* gate, const float* up, int64_t from, int64_t to, float* out) {
  const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
  int64_t e = from;
  for (; e + 32 <= to; e += 32)
    for (int64_t h = e; h < e + 32; h += 16) {
      const __m512 g = _mm512_loadu_ps(gate + h);
      const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_xor_ps(sign, g))));
      _mm512_storeu_ps(out + h, _mm512_mul_ps(s, _mm512_loadu_ps(up + h)));
    }
  for (; e < to; ++e) out[e] = gate[e] / (1.f + std::exp(-gate[e])) * up[e];
}
#endif

using SiluSpan = void (*)(const float*, const float*, int64_t, int64_t, float*);

// The span that follows the SiLU kernel ATen runs here (nullptr: neither).
SiluSpan aten_silu_span() {
  const auto capability = at::get_cpu_capability();
  if (capability == "AVX2") return silu_mul_span;
#if defined(__AVX512F__)
  if (capability == "AVX512") return silu_mul_span16;
#endif
  return nullptr;
}

// Where ATen's elementwise loop over numel elements starts anew besides each row's start: each thread's chunk, when
// TensorIterator::for_each splits them (at::parallel_for, grain 32768: one chunk per thread, divup(numel, threads)
// long). Returns the chunk length (numel: no split).
int64_t aten_chunk(int64_t numel) {
  const int64_t grain = at::internal::GRAIN_SIZE, threads = at::get_num_threads();
  if (numel < grain || threads == 1 || at::in_parallel_region()) return numel;
  const int64_t parts = std::min(threads, (numel + grain - 1) / grain);
  return (numel + parts - 1) / parts;
}

void check_rows(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.stride(1) == 1, "row_ops: ", what,
              " (T, n) float32 with contiguous rows");
}

void check_norm_weight(const torch::Tensor& w, int64_t n) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "row_ops: the norm weight (", n, ",) float32");
}

// A contiguous float32 tensor filled from a fixed sequence of its own (the process's torch generator is left alone):
// values in [-2^23, 2^23) / scale, `state` carried on to the next call.
void fill_seeded(torch::Tensor& t, uint32_t& state, int32_t scale) {
  float* p = t.data_ptr<float>();
  for (int64_t e = 0; e < t.numel(); ++e) {
    state = state * 1664525u + 1013904223u;
    p[e] = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / static_cast<float>(scale);
  }
}

// Whether ATen's RMS norm gives norm_row's bits here: under its AVX2 kernels by construction; under its AVX-512 ones
// where its sum still adds in the AVX2 order (torch 2.13 registers no AVX-512 sum: its AVX-512 builds run the AVX2
// reduction; pow, the products and rsqrt round each element alike at any width). That is a fact of one torch build,
// not a promise, so it is asked once: seeded rows of lengths that reach the cascade's levels and its leftovers, normed
// both ways, the bits compared (a sum in another order differed in 25-60 % of such rows).
bool norm_matches_aten() {
  uint32_t state = 12345;
  for (const int64_t n : {13, 40, 100, 768, 1000, 5125}) {
    auto x = torch::empty({3, n}, torch::kFloat), w = torch::empty({n}, torch::kFloat);
    for (auto* t : {&x, &w}) fill_seeded(*t, state, 1 << 22);
    const auto want = w * (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5));  // decoder.RMSNorm in float32
    if (!at::equal(rms_norm_rows(x, w, 1e-5), want)) return false;
  }
  return true;
}

// Whether silu_mul_rows gives ATen's silu(gate) * up here: seeded rows of lengths with 32-float runs, scalar tails and
// (T x 3072, over ATen's grain) a split between threads, values of up to +-16 (exp's range where it rounds most).
bool silu_matches_aten() {
  uint32_t state = 54321;
  for (const auto& [T, n] : std::initializer_list<std::pair<int64_t, int64_t>>{{1, 13}, {3, 40}, {2, 1000},
                                                                              {13, 3072}, {16, 3072}}) {
    auto fc = torch::empty({T, 2 * n}, torch::kFloat);
    fill_seeded(fc, state, 1 << 19);
    const auto halves = fc.chunk(2, -1);
    if (!at::equal(silu_mul_rows(halves[0], halves[1]), at::silu(halves[0]) * halves[1])) return false;
  }
  return true;
}

}  // namespace

// ATen picks its kernels once per process (the CPU, or ATEN_CPU_CAPABILITY).
bool norm_rows_exact() {
  static const bool exact = [] {
    const auto capability = at::get_cpu_capability();
    return capability == "AVX2" || (capability == "AVX512" && norm_matches_aten());
  }();
  return exact;
}

// SiLU: ATen's AVX2 kernel by construction; its AVX-512 one where seeded rows give the same bits both ways (the
// vectors' exp is Sleef's in torch 2.13's vec512_float.h, a fact of that build asked once, as for the norms).
bool silu_rows_exact() {
  static const bool exact = [] {
    const auto capability = at::get_cpu_capability();
    return capability == "AVX2" || (capability == "AVX512" && aten_silu_span() != nullptr && silu_matches_aten());
  }();
  return exact;
}

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  check_rows(x, "x");
  const int64_t T = x.size(0), n = x.size(1);
  check_norm_weight(w, n);
  auto out = torch::empty({T, n}, x.options());
  // Rows of at least ATen's grain between them split between the threads (a prefill's 2,048 rows; each row normed
  // whole by one thread, so the same bits); a decode step's few rows stay on this one.
  at::parallel_for(0, T, std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t t = begin; t < end; ++t)
                       norm_row(x.data_ptr<float>() + t * x.stride(0), w.data_ptr<float>(), n,
                                static_cast<float>(eps), out.data_ptr<float>() + t * n);
                   });
  return out;
}

std::vector<torch::Tensor> add_rms_norm_rows(const torch::Tensor& x, const torch::Tensor& delta,
                                             const torch::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(delta, "delta");
  TORCH_CHECK(delta.sizes() == x.sizes(), "row_ops: x and delta differ in shape");
  const int64_t T = x.size(0), n = x.size(1);
  check_norm_weight(w, n);
  auto sum = torch::empty({T, n}, x.options()), out = torch::empty({T, n}, x.options());
  for (int64_t t = 0; t < T; ++t) {
    const float* a = x.data_ptr<float>() + t * x.stride(0);
    const float* b = delta.data_ptr<float>() + t * delta.stride(0);
    float* s = sum.data_ptr<float>() + t * n;
    for (int64_t e = 0; e < n; ++e) s[e] = a[e] + b[e];
    norm_row(s, w.data_ptr<float>(), n, static_cast<float>(eps), out.data_ptr<float>() + t * n);
  }
  return {sum, out};
}

namespace {

// Row t of a (T, n) SiLU(gate) * up: its spans from its start and from each chunk start inside it (aten_chunk).
void silu_mul_row(SiluSpan span, const float* g, const float* u, float* o, int64_t t, int64_t n, int64_t chunk) {
  int64_t from = 0;
  for (int64_t c = (t * n / chunk + 1) * chunk; c < (t + 1) * n; c += chunk) {
    span(g, u, from, c - t * n, o);
    from = c - t * n;
  }
  span(g, u, from, n, o);
}

SiluSpan checked_silu_span() {
  static const SiluSpan span = aten_silu_span();
  TORCH_CHECK(span != nullptr, "row_ops: SiLU follows ATen's AVX2 or AVX-512 kernels, and ATen runs neither here");
  return span;
}

// rows(0, T), split between the threads where ATen splits the T * n elements (chunk < T * n), each row's spans
// computed as on one thread: the same bits. At batch 16 of the 125M model (16 x 3072) one thread took 28 us a layer,
// as long as ATen's two-thread SiLU and product together.
template <typename Rows>
void over_rows(int64_t T, int64_t n, int64_t chunk, const Rows& rows) {
  if (chunk < T * n)
    at::parallel_for(0, T, 1, rows);
  else
    rows(0, T);
}

inline float widen_bf16(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof(f));
  return f;
}

// float32 -> bf16 bits as ATen's .to(torch.bfloat16) rounds a float32 tensor: to nearest even, a NaN to 0xffff.
inline uint16_t round_to_bf16(float f) {
  if (std::isnan(f)) return 0xffff;
  uint32_t word;
  std::memcpy(&word, &f, sizeof(word));
  return static_cast<uint16_t>((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
}

}  // namespace

torch::Tensor silu_mul_rows(const torch::Tensor& gate, const torch::Tensor& up) {
  check_rows(gate, "gate");
  check_rows(up, "up");
  TORCH_CHECK(up.sizes() == gate.sizes(), "row_ops: gate and up differ in shape");
  const SiluSpan span = checked_silu_span();
  const int64_t T = gate.size(0), n = gate.size(1);
  auto out = torch::empty({T, n}, gate.options());
  const int64_t chunk = aten_chunk(T * n);
  over_rows(T, n, chunk, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      silu_mul_row(span, gate.data_ptr<float>() + t * gate.stride(0), up.data_ptr<float>() + t * up.stride(0),
                   out.data_ptr<float>() + t * n, t, n, chunk);
  });
  return out;
}

torch::Tensor silu_mul_bf16_rows(const torch::Tensor& fc) {
  TORCH_CHECK(fc.dim() == 2 && fc.scalar_type() == at::kBFloat16 && fc.stride(1) == 1 && fc.size(1) % 2 == 0,
              "row_ops: fc (T, 2 I) bfloat16 with contiguous rows");
  const SiluSpan span = checked_silu_span();
  const int64_t T = fc.size(0), n = fc.size(1) / 2;
  auto out = torch::empty({T, n}, fc.options());
  const int64_t chunk = aten_chunk(T * n);  // the float32 halves' SiLU: (T, n) elements
  const auto* in = reinterpret_cast<const uint16_t*>(fc.data_ptr<at::BFloat16>());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  over_rows(T, n, chunk, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<float> row;  // gate, up, silu(gate) * up of one row, widened
    row.resize(3 * n);
    float *g = row.data(), *u = g + n, *h = u + n;
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* r = in + t * fc.stride(0);
      for (int64_t e = 0; e < n; ++e) g[e] = widen_bf16(r[e]);
      for (int64_t e = 0; e < n; ++e) u[e] = widen_bf16(r[n + e]);
      silu_mul_row(span, g, u, h, t, n, chunk);
      for (int64_t e = 0; e < n; ++e) o[t * n + e] = round_to_bf16(h[e]);
    }
  });
  return out;
}

#else  // no AVX2 + FMA: decode_layers.cpp keeps the ATen operations

bool norm_rows_exact() { return false; }
bool silu_rows_exact() { return false; }

torch::Tensor rms_norm_rows(const torch::Tensor&, const torch::Tensor&, double) {
  TORCH_CHECK(false, "row_ops: built without AVX2 + FMA");
}

std::vector<torch::Tensor> add_rms_norm_rows(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             double) {
  TORCH_CHECK(false, "row_ops: built without AVX2 + FMA");
}

torch::Tensor silu_mul_rows(const torch::Tensor&, const torch::Tensor&) {
  TORCH_CHECK(false, "row_ops: built without AVX2 + FMA");
}

torch::Tensor silu_mul_bf16_rows(const torch::Tensor&) {
  TORCH_CHECK(false, "row_ops: built without AVX2 + FMA");
}

#endif
