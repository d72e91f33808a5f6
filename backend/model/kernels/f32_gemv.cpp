// A float32 linear of a few rows (the products of a decode step of up to kGemvMaxRows sequences), its weights read
// once, in their own row-major layout: y = x W^T + b, with its own float32 summation order.
//
// Why: on CPUs without native bf16 arithmetic (AVX2 + FMA, the 2-core EPYC) float32 is the fast dtype, and
// at one row a linear is a read of its weights. oneDNN's float32 kernel read the 125M model's linears at 9-10 GB/s
// there where a sum on both cores reads 18-23 GB/s; this kernel at 13-16 GB/s, and at 16 rows it takes oneDNN's time
// or less (perf/ISSUE16.md, "A float32 GEMV for CPUs without AVX-512").
// Each thread takes a contiguous range of output columns (rows of W), kCols at a time: each block of kCols rows of W
// is read from memory once, by the first pass of kRowTile rows of x, then from L1 / L2 by the other passes. An
// accumulator holds 8 partial sums of one output (k = i mod 8), summed at the end, then the columns past the last
// multiple of 8, then the bias: the same order for every row of x, whatever the number of rows.
// AVX2 + FMA (every x86-64 CPU this project serves has them); elsewhere f32_gemv_available() is false and oneDNN
// keeps every linear.
#include "kernels.h"

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

// Outputs (rows of W) per block: 4 weight vectors and 3 x 4 accumulators fill the 16 registers; one row of x takes
// 8 (8 weight streams: 24-26 ms against 28-29 for 4 over the 125M model's linears, perf/ISSUE16.md).
constexpr int64_t kCols = 4, kColsOneRow = 8;
constexpr int64_t kRowTile = 3;  // rows of x per pass over a block

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[m * ldo + j] = dot(row j of w, row m of x) + bias[j] for MT rows of x (ldx apart), NT rows of w (K apart).
template <int64_t MT, int64_t NT>
void block_dots(const float* w, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo, const float* bias) {
  __m256 acc[MT][NT];
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t j = 0; j < NT; ++j) acc[m][j] = _mm256_setzero_ps();
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NT];
    for (int64_t j = 0; j < NT; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
    for (int64_t m = 0; m < MT; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * ldx + k);
      for (int64_t j = 0; j < NT; ++j) acc[m][j] = _mm256_fmadd_ps(wv[j], xv, acc[m][j]);
    }
  }
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t j = 0; j < NT; ++j) {
      float sum = hsum(acc[m][j]);
      for (int64_t k = K8; k < K; ++k) sum += w[j * K + k] * x[m * ldx + k];
      out[m * ldo + j] = bias != nullptr ? sum + bias[j] : sum;
    }
}

// Every row of x (M of them) against NT rows of w: passes of kRowTile rows, then the remaining one or two.
template <int64_t NT>
void block_rows(const float* w, int64_t K, const float* x, int64_t ldx, int64_t M, float* out, int64_t ldo,
                const float* bias) {
  int64_t m = 0;
  for (; m + kRowTile <= M; m += kRowTile) block_dots<kRowTile, NT>(w, K, x + m * ldx, ldx, out + m * ldo, ldo, bias);
  switch (M - m) {
    case 2: block_dots<2, NT>(w, K, x + m * ldx, ldx, out + m * ldo, ldo, bias); break;
    case 1: block_dots<1, NT>(w, K, x + m * ldx, ldx, out + m * ldo, ldo, bias); break;
    default: break;
  }
}

// y (M, N) = x W^T + b over blocks of NT outputs, each thread a contiguous range of them; the last N % NT outputs
// one at a time.
template <int64_t NT>
void product(const float* x, int64_t ldx, int64_t M, const float* w, int64_t N, int64_t K, const float* b, float* y) {
  const int64_t blocks = N / NT;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * NT;
      block_rows<NT>(w + n0 * K, K, x, ldx, M, y + n0, N, b ? b + n0 : nullptr);
    }
  });
  for (int64_t n = blocks * NT; n < N; ++n) block_rows<1>(w + n * K, K, x, ldx, M, y + n, N, b ? b + n : nullptr);
}

}  // namespace

bool f32_gemv_available() { return true; }

torch::Tensor f32_gemv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && x.scalar_type() == at::kFloat,
              "f32_gemv: x (M, K) float32 with 1 <= M <= ", kGemvMaxRows);
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "f32_gemv: weight (N, K) float32, contiguous");
  const int64_t M = x.size(0), N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.size(1) == K, "f32_gemv: x has ", x.size(1), " columns, the weight ", K);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == at::kFloat && bias.is_contiguous()),
              "f32_gemv: bias (N,) float32");
  const auto xc = x.stride(1) == 1 ? x : x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* b = has_bias ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (M == 1)
    product<kColsOneRow>(xp, xc.stride(0), M, w, N, K, b, yp);
  else
    product<kCols>(xp, xc.stride(0), M, w, N, K, b, yp);
  return y;
}

#else  // no AVX2 + FMA: every float32 linear stays on oneDNN

bool f32_gemv_available() { return false; }

torch::Tensor f32_gemv(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  TORCH_CHECK(false, "f32_gemv: built without AVX2 + FMA (this CPU has neither)");
}

#endif
