// A float32 linear of a few rows (the products of a decode step of up to kGemvMaxRows sequences), its weights read
// once, in their own row-major layout: y = x W^T + b, with its own float32 summation order. The weights are float32,
// or bf16 where that holds every one of them exactly (a bf16 checkpoint's linears widened to float32): each is
// widened to float32 as it is read (exact), so the products are the float32 ones over half the bytes.
//
// Why: on CPUs without native bf16 arithmetic (AVX2 + FMA, the 2-core EPYC) float32 is the fast dtype, and
// at one row a linear is a read of its weights. oneDNN's float32 kernel read the 125M model's linears at 9-10 GB/s
// there where a sum on both cores reads 18-23 GB/s; this kernel at 13-16 GB/s, and at 16 rows it takes oneDNN's time
// or less (perf/ISSUE16.md, "A float32 GEMV for CPUs without AVX-512").
// Each thread takes a contiguous range of output columns (rows of W), kCols at a time: each block of kCols rows of W
// is read from memory once, by the first pass of kRowTile rows of x, then from L1 / L2 by the other passes, every
// pass asking for its share of the next block as it goes. An
// accumulator holds 8 partial sums of one output (k = i mod 8), summed at the end, then the columns past the last
// multiple of 8, then the bias: the same order for every row of x, whatever the number of rows.
// AVX2 + FMA (every x86-64 CPU this project serves has them); elsewhere f32_gemv_available() is false and oneDNN
// keeps every linear.
#include "kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

// Outputs (rows of W) per block and rows of x per pass over it: 3 weight vectors, one x vector and 4 x 3
// accumulators fill the 16 registers, and 16 rows take 4 passes with none left over (against 3 x 4 blocks: 0.83x
// the time of the 125M model's linears at 16 rows, 0.86x at 8, 0.87x at 4; perf/ISSUE16.md). One row of x takes
// 8 outputs (8 weight streams: 24-26 ms against 28-29 for 4 over the 125M model's linears).
constexpr int64_t kCols = 3, kRowTile = 4, kColsOneRow = 8;

// Eight weights from p as float32: float32 as they are; bf16 as the upper 16 bits of a float32 whose lower 16 are 0,
// which is the same value (a bf16 is a float32 with its mantissa cut to 7 bits).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline float widen(float v) { return v; }
inline float widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Pins v to a register at this point (an empty asm that reads and writes it). Why: GCC otherwise folds the load of a
// vector used by several FMAs into each of them as a memory operand (x, and float32 weights at more than one row),
// so a step of 8 columns of a 4 x 3 block issued 15 loads for its 12 FMAs instead of 7, bound by loads, not FMAs.
// The values and the order of the sums do not change (the same bits).
inline void keep_in_register(__m256& v) { __asm__("" : "+x"(v)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lines of the next block a pass asks for into L2 (Prefetch::lines of them from Prefetch::first, evenly over the
// pass's steps of 8 columns), or none. Why: the other passes over this block compute from the caches while the next
// block's reads are in flight; without it each block's first pass waited on memory and the passes after it left the
// memory idle. Every pass takes its share: asked for by the first pass alone, the next block's lines came in a burst
// a quarter of the block's time long at 16 rows, and the memory sat idle for the rest of it.
struct Prefetch {
  const char* first = nullptr;
  int64_t lines = 0;
};

// out[m * ldo + j] = dot(row j of w, row m of x) + bias[j] for MT rows of x (ldx apart), NT rows of w (K apart),
// W: float or uint16_t (bf16 bits); asking for the lines of `ahead` as it goes. Not inlined (as GCC chooses today):
// inlined into a larger caller, its 12 accumulators went to the stack once, 1.47x the 125M model's batch-16 float32
// step (perf/ISSUE16.md, "The next layer's K/V rows asked for during proj").
template <int64_t MT, int64_t NT, typename W>
__attribute__((noinline)) void block_dots(const W* w, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo,
                                          const float* bias, Prefetch ahead) {
  __m256 acc[MT][NT];
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t j = 0; j < NT; ++j) acc[m][j] = _mm256_setzero_ps();
  const int64_t K8 = K / 8 * 8, steps = K8 / 8;
  int64_t owed = 0;  // ahead.lines per step, in steps: a line is asked for each time it reaches a whole step
  const char* line = ahead.first;
  for (int64_t k = 0; k < K8; k += 8) {
    for (owed += ahead.lines; owed >= steps; owed -= steps, line += 64) _mm_prefetch(line, _MM_HINT_T1);
    __m256 wv[NT];
    for (int64_t j = 0; j < NT; ++j) {
      wv[j] = load8(w + j * K + k);
      if constexpr (MT > 1) keep_in_register(wv[j]);  // one row uses each weight once: a folded load is best there
    }
    for (int64_t m = 0; m < MT; ++m) {
      __m256 xv = _mm256_loadu_ps(x + m * ldx + k);
      keep_in_register(xv);
      for (int64_t j = 0; j < NT; ++j) acc[m][j] = _mm256_fmadd_ps(wv[j], xv, acc[m][j]);
    }
  }
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t j = 0; j < NT; ++j) {
      float sum = hsum(acc[m][j]);
      // one fused multiply-add per column, spelled out: the same rounding for float32 and bf16 weights
      for (int64_t k = K8; k < K; ++k) sum = std::fma(widen(w[j * K + k]), x[m * ldx + k], sum);
      out[m * ldo + j] = bias != nullptr ? sum + bias[j] : sum;
    }
}

// Every row of x (M of them) against NT rows of w: passes of MT rows, then the rest (fewer than MT) in one pass;
// the passes share the asking for the next block's NT * K weights (`next`, or nullptr: none) between them.
template <int64_t MT, int64_t NT, typename W>
void block_rows(const W* w, int64_t K, const float* x, int64_t ldx, int64_t M, float* out, int64_t ldo,
                const float* bias, const W* next) {
  const int64_t passes = (M + MT - 1) / MT;
  const int64_t lines = next != nullptr ? (NT * K * static_cast<int64_t>(sizeof(W)) + 63) / 64 : 0;
  const auto share = [&](int64_t pass) {  // pass's lines: [lines * pass / passes, lines * (pass + 1) / passes)
    const int64_t from = lines * pass / passes;
    return Prefetch{reinterpret_cast<const char*>(next) + from * 64, lines * (pass + 1) / passes - from};
  };
  int64_t m = 0;
  for (; m + MT <= M; m += MT) block_dots<MT, NT>(w, K, x + m * ldx, ldx, out + m * ldo, ldo, bias, share(m / MT));
  if constexpr (MT > 1) {
    const float* xm = x + m * ldx;
    float* om = out + m * ldo;
    const Prefetch last = share(passes - 1);
    switch (M - m) {
      case 3: block_dots<3, NT>(w, K, xm, ldx, om, ldo, bias, last); break;
      case 2: block_dots<2, NT>(w, K, xm, ldx, om, ldo, bias, last); break;
      case 1: block_dots<1, NT>(w, K, xm, ldx, om, ldo, bias, last); break;
      default: break;
    }
  }
}

// y (M, N) = x W^T + b over blocks of NT outputs, each thread a contiguous range of them (passes of MT rows of x);
// the last N % NT outputs one at a time. prefetch: whether each block asks for the next (products says where).
template <int64_t MT, int64_t NT, bool prefetch, typename W>
void product(const float* x, int64_t ldx, int64_t M, const W* w, int64_t N, int64_t K, const float* b, float* y) {
  const int64_t blocks = N / NT;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * NT;
      const W* next = prefetch && blk + 1 < end ? w + (n0 + NT) * K : nullptr;
      block_rows<MT, NT>(w + n0 * K, K, x, ldx, M, y + n0, N, b ? b + n0 : nullptr, next);
    }
  });
  for (int64_t n = blocks * NT; n < N; ++n)
    block_rows<MT, 1, W>(w + n * K, K, x, ldx, M, y + n, N, b ? b + n : nullptr, nullptr);
}

// One row of x: 8 weight streams; more rows: passes of kRowTile over blocks of kCols, each asking for the next
// block. At one row float32 weights are left to the hardware's prefetch, which keeps up; bf16 ones ask for the next
// block too: the 125M model's linears at one row took 17.5 ms with it against 22.9 without, float32 ones 27.2
// without against 28.3 with (perf/ISSUE16.md, "The float32 GEMV over bf16 weights").
template <typename W>
void products(const float* x, int64_t ldx, int64_t M, const W* w, int64_t N, int64_t K, const float* b, float* y) {
  if (M == 1)
    product<1, kColsOneRow, std::is_same_v<W, uint16_t>>(x, ldx, M, w, N, K, b, y);
  else
    product<kRowTile, kCols, true>(x, ldx, M, w, N, K, b, y);
}

}  // namespace

bool f32_gemv_available() { return true; }

torch::Tensor f32_gemv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && x.scalar_type() == at::kFloat,
              "f32_gemv: x (M, K) float32 with 1 <= M <= ", kGemvMaxRows);
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kFloat || bf16) && weight.is_contiguous(),
              "f32_gemv: weight (N, K) float32 or bfloat16, contiguous");
  const int64_t M = x.size(0), N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.size(1) == K, "f32_gemv: x has ", x.size(1), " columns, the weight ", K);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == at::kFloat && bias.is_contiguous()),
              "f32_gemv: bias (N,) float32");
  const auto xc = x.stride(1) == 1 ? x : x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* b = has_bias ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  if (bf16)
    products(xp, xc.stride(0), M, reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), N, K, b, yp);
  else
    products(xp, xc.stride(0), M, weight.data_ptr<float>(), N, K, b, yp);
  return y;
}

#else  // no AVX2 + FMA: every float32 linear stays on oneDNN

bool f32_gemv_available() { return false; }

torch::Tensor f32_gemv(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  TORCH_CHECK(false, "f32_gemv: built without AVX2 + FMA (this CPU has neither)");
}

#endif
