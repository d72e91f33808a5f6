// A one-row bf16 linear (the products of a batch-1 decode step), streamed at the memory's read rate:
// y = bf16(bf16(x) W^T + b) widened to float32, which is what PrepackedLinear computes on oneDNN for bf16 linears
// beside float32 activations, with its own float32 summation order.
//
// Why: at one row a linear is a read of its weights. oneDNN's bf16 kernel reads its packed weights at ~20 GB/s on
// the development CPU, where a plain read runs at 28-38 GB/s; this kernel reads W interleaved (bf16_gemv.py's
// interleave: rows in blocks of 4, the last block the remaining rows, each block's rows 32 values at a time,
// [K/32][rows][32]), so each thread's share is one sequential stream, read at ~0.9x a plain read (perf/ISSUE16.md,
// the 125M model's layers from DRAM). AVX-512 BF16 only (VDPBF16PS); elsewhere
// bf16_gemv_available() is false and oneDNN keeps every linear.
#include "kernels.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

// Rows per block. Measured on the development CPU (2026-11-26, the 125M model's layers from DRAM, 2 threads): 4 rows
// 30.1 GB/s, 2 rows 30.1, 8 rows 25.3, 16 rows 23.9, a plain read 33.2; one thread 26.0 / 24.7 / 23.5 / 21.5 / 28.9.
constexpr int64_t kRows = 4;
constexpr int64_t kChunk = 32;  // bf16 values per 512-bit load

// out[r] = dot(row r of the block, x) for the block's `rows` rows; block: [chunks][rows][32] bf16, x: chunks x 32.
template <int64_t R>
void block_dots(const uint16_t* block, const uint16_t* x, int64_t chunks, int64_t rows, float* out) {
  const int64_t n = R == kRows ? R : rows;  // a compile-time count for full blocks
  __m512 acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + c * kChunk);
    const uint16_t* chunk = block + c * n * kChunk;
    for (int64_t r = 0; r < n; ++r) {
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(chunk + r * kChunk), xv);
    }
  }
  for (int64_t r = 0; r < rows; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

// float32 -> bf16 -> float32, rounding to nearest even (as torch's .to(torch.bfloat16) and oneDNN's bf16 output)
inline float round_bf16(float v) { return static_cast<float>(c10::BFloat16(v)); }

}  // namespace

bool bf16_gemv_available() { return true; }

torch::Tensor bf16_gemv(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.scalar_type() == at::kFloat, "bf16_gemv: x (1, K) float32");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.size(1) % kChunk == 0, "bf16_gemv: packed (N, K padded to 32) bfloat16, interleaved");
  const int64_t N = packed.size(0), Kp = packed.size(1), K = x.size(1), chunks = Kp / kChunk;
  TORCH_CHECK(K <= Kp && Kp - K < kChunk, "bf16_gemv: x has ", K, " columns, the weight ", Kp, " (padded)");
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == at::kBFloat16 && bias.is_contiguous()),
              "bf16_gemv: bias (N,) bfloat16");
  // x rounded to bf16 as PrepackedLinear rounds it, zero past K (the padded weight columns are zero too)
  std::vector<c10::BFloat16> xb(Kp, c10::BFloat16(0.f));
  const auto xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  for (int64_t k = 0; k < K; ++k) xb[k] = c10::BFloat16(xp[k]);
  auto y = torch::empty({1, N}, x.options());
  float* yp = y.data_ptr<float>();
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data());
  const at::BFloat16* b = has_bias ? bias.data_ptr<at::BFloat16>() : nullptr;
  const int64_t blocks = (N + kRows - 1) / kRows;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * kRows, rows = std::min(kRows, N - n0);
      float* out = yp + n0;
      if (rows == kRows) block_dots<kRows>(w + n0 * Kp, xv, chunks, rows, out);
      else block_dots<kRows - 1>(w + n0 * Kp, xv, chunks, rows, out);
      for (int64_t r = 0; r < rows; ++r) out[r] = round_bf16(b ? out[r] + static_cast<float>(b[n0 + r]) : out[r]);
    }
  });
  return y;
}

#else  // no AVX-512 BF16: every bf16 linear stays on oneDNN

bool bf16_gemv_available() { return false; }

torch::Tensor bf16_gemv(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  TORCH_CHECK(false, "bf16_gemv: built without AVX-512 BF16 (this CPU has none)");
}

#endif
