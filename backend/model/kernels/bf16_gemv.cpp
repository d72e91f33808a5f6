// A bf16 linear of a few rows (the products of a decode step of up to kGemvMaxRows sequences), its weights streamed
// once at the memory's read rate:
// y = bf16(bf16(x) W^T + b) widened to float32, which is what PrepackedLinear computes on oneDNN for bf16 linears
// beside float32 activations, with its own float32 summation order.
//
// Why: at one row a linear is a read of its weights. oneDNN's bf16 kernel reads its packed weights at ~20 GB/s on
// the development CPU, where a plain read runs at 28-38 GB/s; this kernel reads W interleaved (bf16_gemv.py's
// interleave: rows in blocks of 4, the last block the remaining rows, each block's rows 32 values at a time,
// [K/32][rows][32]), so each thread's share is one sequential stream, read at ~0.9x a plain read (perf/ISSUE16.md,
// the 125M model's layers from DRAM). At 2-16 rows each block is read from memory once for every row (the next
// blocks prefetched meanwhile): the 125M model's linears at 8 rows in 0.7x oneDNN's time, at 16 in 0.85x.
// AVX-512 BF16 only (VDPBF16PS; with AVX-512 BW / VL for the masked tails, which every such CPU has); elsewhere
// bf16_gemv_available() is false and oneDNN keeps every linear.
#include "kernels.h"

#include <algorithm>
#include <cstdint>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

// Rows per block. Measured on the development CPU (2026-11-26, the 125M model's layers from DRAM, 2 threads): 4 rows
// 30.1 GB/s, 2 rows 30.1, 8 rows 25.3, 16 rows 23.9, a plain read 33.2; one thread 26.0 / 24.7 / 23.5 / 21.5 / 28.9.
constexpr int64_t kRows = 4;
constexpr int64_t kChunk = 32;  // bf16 values per 512-bit load

// Four float32 values -> bf16 -> float32, rounding to nearest even with NaN kept quiet: c10::BFloat16's rounding
// (torch's .to(torch.bfloat16), oneDNN's bf16 output), denormals included, on integer lanes.
inline __m128 round_bf16(__m128 v) {
  const __m128i bits = _mm_castps_si128(v);
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
  const __m128i rounded = _mm_and_si128(_mm_add_epi32(bits, _mm_add_epi32(lsb, _mm_set1_epi32(0x7fff))),
                                        _mm_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m128 nan = _mm_castsi128_ps(_mm_set1_epi32(0x7fc00000));
  return _mm_blendv_ps(_mm_castsi128_ps(rounded), nan, _mm_cmpunord_ps(v, v));
}

// The four sums of a0..a3's lanes, [sum a0, sum a1, sum a2, sum a3]: one transpose-and-add tree for the four (13
// instructions where four separate reductions take ~32; at 24 chunks a row, K = 768, they would cost as much as the
// products). The same tree for every row: a row's sums do not depend on the rows beside it.
inline __m128 sums4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));  // per 128: a0 a1 a0 a1
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));  // a0 a1 a2 a3
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out[0..rows) = round_bf16(sums + bias[0..rows)) for rows <= 4; bias: bf16 or nullptr.
inline void finish(__m128 v, float* out, const at::BFloat16* bias, int64_t rows) {
  const __mmask8 mask = static_cast<__mmask8>((1u << rows) - 1);
  if (bias != nullptr) {  // bf16 -> float32 is exact: the 16 bits move to the top half
    const __m128i b16 = _mm_cvtepu16_epi32(_mm_maskz_loadu_epi16(mask, bias));  // no read past the end
    v = _mm_add_ps(v, _mm_castsi128_ps(_mm_slli_epi32(b16, 16)));
  }
  _mm_mask_storeu_ps(out, mask, round_bf16(v));
}

// Rows m of out (ldo apart), columns [0, rows): round_bf16(dot(row r of the block, row m of xs) + bias[r]) for MT
// rows of xs (Kp bf16 values apart); block: [chunks][rows][32] bf16, rows <= 4 (kFull: 4, known when compiling).
// Every (m, r) sum is one float32 vector accumulated chunk by chunk, then reduced by sums4. MT x 4 accumulators, 4
// weight vectors and one x vector stay in the 32 registers (MT <= 6): each weight chunk is loaded once for MT rows
// (from DRAM for the first MT, from the caches for the next).
// `next`: a block to prefetch chunk by chunk into L2 meanwhile (nullptr: none).
template <bool kFull, int64_t MT>
void block_dots(const uint16_t* block, const uint16_t* xs, int64_t Kp, int64_t chunks, int64_t rows, float* out,
                int64_t ldo, const at::BFloat16* bias, const uint16_t* next) {
  const int64_t n = kFull ? kRows : rows;
  __m512 acc[MT][kRows];
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t r = 0; r < kRows; ++r) acc[m][r] = _mm512_setzero_ps();  // rows past n stay zero
  for (int64_t c = 0; c < chunks; ++c) {
    const uint16_t* chunk = block + c * n * kChunk;
    if (next != nullptr)
      for (int64_t r = 0; r < kRows; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(next + (c * kRows + r) * kChunk), _MM_HINT_T1);
    __m512bh w[kRows];
    for (int64_t r = 0; r < n; ++r) w[r] = (__m512bh)_mm512_loadu_si512(chunk + r * kChunk);
    for (int64_t m = 0; m < MT; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xs + m * Kp + c * kChunk);
      for (int64_t r = 0; r < n; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], w[r], xv);
    }
  }
  for (int64_t m = 0; m < MT; ++m) finish(sums4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]), out + m * ldo, bias, n);
}

constexpr int64_t kTile = 6;  // rows of x per pass over a block
constexpr int64_t kAhead = 4;  // blocks between the one computed and the one prefetched

// Every row of xs (M of them) against one block: passes of kTile rows, then the remaining 1 to kTile - 1 rows.
// With more than one pass the block is read from memory once and from the caches after, and the memory would sit
// idle during the later passes: the first pass prefetches a later full block (`next`, kAhead blocks on; nullptr:
// none) so that its read overlaps this block's products.
template <bool kFull>
void block_rows(const uint16_t* block, const uint16_t* xs, int64_t M, int64_t Kp, int64_t chunks, int64_t rows,
                float* out, int64_t ldo, const at::BFloat16* bias, const uint16_t* next) {
  const uint16_t* prefetch = M > kTile ? next : nullptr;  // one pass: the hardware's stream prefetch keeps up
  int64_t m = 0;
  for (; m + kTile <= M; m += kTile, prefetch = nullptr)
    block_dots<kFull, kTile>(block, xs + m * Kp, Kp, chunks, rows, out + m * ldo, ldo, bias, prefetch);
  const uint16_t* x = xs + m * Kp;
  float* o = out + m * ldo;
  switch (M - m) {
    case 5: block_dots<kFull, 5>(block, x, Kp, chunks, rows, o, ldo, bias, prefetch); break;
    case 4: block_dots<kFull, 4>(block, x, Kp, chunks, rows, o, ldo, bias, prefetch); break;
    case 3: block_dots<kFull, 3>(block, x, Kp, chunks, rows, o, ldo, bias, prefetch); break;
    case 2: block_dots<kFull, 2>(block, x, Kp, chunks, rows, o, ldo, bias, prefetch); break;
    case 1: block_dots<kFull, 1>(block, x, Kp, chunks, rows, o, ldo, bias, prefetch); break;
    default: break;
  }
}

}  // namespace

bool bf16_gemv_available() { return true; }

torch::Tensor bf16_gemv(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && x.scalar_type() == at::kFloat,
              "bf16_gemv: x (M, K) float32 with 1 <= M <= ", kGemvMaxRows);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.size(1) % kChunk == 0, "bf16_gemv: packed (N, K padded to 32) bfloat16, interleaved");
  const int64_t M = x.size(0), N = packed.size(0), Kp = packed.size(1), K = x.size(1), chunks = Kp / kChunk;
  TORCH_CHECK(K <= Kp && Kp - K < kChunk, "bf16_gemv: x has ", K, " columns, the weight ", Kp, " (padded)");
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == at::kBFloat16 && bias.is_contiguous()),
              "bf16_gemv: bias (N,) bfloat16");
  // x rounded to bf16 as PrepackedLinear rounds it (the same ATen conversion), zero past K (the padded weight
  // columns are zero too): (M, Kp) contiguous
  auto xb = x.to(at::kBFloat16);
  xb = (Kp > K ? at::constant_pad_nd(xb, {0, Kp - K}) : xb).contiguous();
  auto y = torch::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const auto* xv = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const at::BFloat16* b = has_bias ? bias.data_ptr<at::BFloat16>() : nullptr;
  const int64_t blocks = (N + kRows - 1) / kRows;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * kRows, rows = std::min(kRows, N - n0);
      const at::BFloat16* bias_rows = b ? b + n0 : nullptr;
      // the block kAhead blocks on, where it is a full one of this thread's
      const uint16_t* next =
          blk + kAhead < end && n0 + (kAhead + 1) * kRows <= N ? w + (n0 + kAhead * kRows) * Kp : nullptr;
      if (rows == kRows) block_rows<true>(w + n0 * Kp, xv, M, Kp, chunks, rows, yp + n0, N, bias_rows, next);
      else block_rows<false>(w + n0 * Kp, xv, M, Kp, chunks, rows, yp + n0, N, bias_rows, nullptr);
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
