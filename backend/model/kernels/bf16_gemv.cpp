// A bf16 linear of a few rows (the products of a decode step of up to kGemvMaxRows sequences), its weights streamed
// once at the memory's read rate:
// y = bf16(bf16(x) W^T + b) widened to float32, which is what PrepackedLinear computes on oneDNN for bf16 linears
// beside float32 activations, with its own float32 summation order.
//
// Why: at one row a linear is a read of its weights. oneDNN's bf16 kernel reads its packed weights at ~20 GB/s on
// the development CPU, where a plain read runs at 28-38 GB/s. This kernel reads W in strips of 64 output columns
// (bf16_gemv.py's interleave: per strip [K/2][columns][2], the pair layout VDPBF16PS multiplies), so each thread's
// share is one sequential stream. Each accumulator holds 16 output columns and sums its K pairs in order: no
// horizontal sums at the end. The first form of this kernel summed each output along K in one vector and reduced it
// at the end; at K = 256 (the demo model) those reductions cost as much as the products, and this form takes 0.52-0.66x
// its time at 16 rows there, 0.8-0.9x at the 125M model's shapes, <= 1x at one row (perf/ISSUE16.md).
// AVX-512 BF16 only (VDPBF16PS; with AVX-512 BW / VL for the masked tails, which every such CPU has); elsewhere
// bf16_gemv_available() is false and oneDNN keeps every linear.
#include "kernels.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t kLanes = 16;  // output columns per accumulator (its float32 lanes); bf16_gemv.py's LANES
constexpr int64_t kStripTiles = 4;  // accumulators across a strip: 64 columns (bf16_gemv.py's STRIP)
constexpr int64_t kLineBytes = 2 * kLanes * sizeof(uint16_t);  // one weight vector (16 bf16 pairs): a cache line
constexpr int64_t kStrip = kLanes * kStripTiles;
constexpr int64_t kPairBytes = kStripTiles * kLineBytes;  // one pair of every column of a full strip: 256 bytes

// Sixteen float32 values' bits rounded to nearest even at bit 16 (the bf16 value in the top half, the low half
// cleared), denormals included, on integer lanes: what c10::BFloat16 and ATen's vectorized conversion compute for
// every value but NaN (each caller sets its NaN).
inline __m512i round_bits_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                          _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

// Sixteen float32 values -> bf16 -> float32, NaN kept quiet (0x7fc00000): c10::BFloat16's rounding (torch's
// .to(torch.bfloat16), oneDNN's bf16 output).
inline __m512 round_bf16(__m512 v) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(round_bits_bf16(v)), nan,
                            _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

// What a pass over a strip prefetches while it computes: the kStripTiles lines of one pair of a full strip at `rows`
// of every `of` of its pairs, spread evenly, from `from` on (nullptr: nothing). `once`: weights read once (a one-pass
// product's own stream), so non-temporal; else into L2, where the later passes read them. The 125M model's linears
// at one row streamed at 0.83-0.90 of the machine's read rate on the hardware's prefetch alone, 0.92-0.95 with T1
// prefetches, 0.90-1.05 with NTA (six rows: 0.69 -> 0.80; perf/ISSUE16.md): NTA lines are meant to leave the other
// caches' contents alone, AMD's L3 (filled by what L2 evicts) included.
// `lines`: another layer's pool rows (pool_lines.h), one line asked for per pair of every pass until they end.
struct Prefetch {
  const char* from = nullptr;
  int64_t rows = 1, of = 1;
  bool once = false;
  PoolLines* lines = nullptr;
};

// Rows m of out (ldo apart), the strip's `cols` columns: round_bf16(dot(column c of W, row m of xs) + bias[c]) for
// MT rows of xs (Kp bf16 values apart, read as Kp / 2 pairs). strip: [Kp / 2][cols][2] bf16, TT = ceil(cols / 16)
// accumulators a row, the last one masked where cols is not a multiple of 16 (only a linear's last strip; kFull:
// cols == 16 TT, known when compiling, plain loads and a constant stride: masked loads took 2.4x the time).
// MT x TT accumulators, TT weight vectors and one broadcast pair of x stay in the 32 registers (MT <= 6, TT <= 4):
// each weight vector is loaded once for MT rows (from DRAM for the first MT, from the caches for the next).
// `pf`: weights this pass prefetches meanwhile (Prefetch).
template <bool kFull, int64_t MT, int64_t TT>
void strip_dots(const uint16_t* strip, const uint16_t* xs, int64_t Kp, int64_t cols, float* out, int64_t ldo,
                const at::BFloat16* bias, Prefetch pf) {
  const int64_t pairs = Kp / 2, width = kFull ? TT * kLanes : cols;
  const int64_t last = width - (TT - 1) * kLanes;  // 1..16 columns in the last accumulator
  const __mmask16 last_mask = static_cast<__mmask16>((1u << last) - 1);
  __m512 acc[MT][TT];
  for (int64_t m = 0; m < MT; ++m)
    for (int64_t t = 0; t < TT; ++t) acc[m][t] = _mm512_setzero_ps();
  const auto* x_pairs = reinterpret_cast<const int32_t*>(xs);  // bf16 pairs of each row of x, Kp / 2 a row
  int64_t tick = 0;  // Bresenham: one prefetched pair per `of` / `rows` pairs of this pass
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* row = strip + p * width * 2;  // this pair of every column of the strip
    if (pf.lines != nullptr && !pf.lines->done()) _mm_prefetch(pf.lines->next(), _MM_HINT_T1);
    if (pf.from != nullptr && (tick += pf.rows) >= pf.of) {
      tick -= pf.of;
      if (pf.once)
        for (int64_t t = 0; t < kStripTiles; ++t) _mm_prefetch(pf.from + t * kLineBytes, _MM_HINT_NTA);
      else
        for (int64_t t = 0; t < kStripTiles; ++t) _mm_prefetch(pf.from + t * kLineBytes, _MM_HINT_T1);
      pf.from += kPairBytes;
    }
    __m512bh w[TT];
    for (int64_t t = 0; t + 1 < TT; ++t) w[t] = (__m512bh)_mm512_loadu_si512(row + t * 2 * kLanes);
    const uint16_t* tail = row + (TT - 1) * 2 * kLanes;
    w[TT - 1] = (__m512bh)(kFull ? _mm512_loadu_si512(tail) : _mm512_maskz_loadu_epi32(last_mask, tail));
    for (int64_t m = 0; m < MT; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(x_pairs[m * pairs + p]);
      for (int64_t t = 0; t < TT; ++t) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], w[t], xv);
    }
  }
  for (int64_t t = 0; t < TT; ++t) {
    const __mmask16 mask = kFull || t + 1 < TT ? static_cast<__mmask16>(0xffff) : last_mask;
    __m512 b = _mm512_setzero_ps();
    if (bias != nullptr)  // bf16 -> float32 is exact: the 16 bits move to the top half
      b = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + t * kLanes)), 16));
    for (int64_t m = 0; m < MT; ++m) {
      const __m512 sum = bias != nullptr ? _mm512_add_ps(acc[m][t], b) : acc[m][t];
      _mm512_mask_storeu_ps(out + m * ldo + t * kLanes, mask, round_bf16(sum));
    }
  }
}

// Rows of x (M, K) float32, ldx apart, to bf16 pairs (M, Kp) in xb, zero past K: rounded to nearest even on integer
// lanes as ATen's vectorized .to(torch.bfloat16) rounds (what PrepackedLinear's oneDNN path gets), a NaN to 0xffff as
// there (a NaN either way: its row's products are NaN). In the kernel rather than as an ATen conversion: one
// operation fewer per linear (~4-7 us each on the development CPU, 4 per layer of every decode step).
void round_rows(const float* x, int64_t M, int64_t K, int64_t ldx, uint16_t* xb, int64_t Kp) {
  const __m512i nan = _mm512_set1_epi32(0xffff);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < Kp; k += kLanes) {
      const int64_t in = std::clamp<int64_t>(K - k, 0, kLanes), out = std::min(kLanes, Kp - k);
      const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << in) - 1), x + m * ldx + k);
      __m512i r = _mm512_srli_epi32(round_bits_bf16(v), 16);
      r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
      _mm256_mask_storeu_epi16(xb + m * Kp + k, static_cast<__mmask16>((1u << out) - 1), _mm512_cvtepi32_epi16(r));
    }
  }
}

constexpr int64_t kTile = 6;  // rows of x per pass over a strip
constexpr int64_t kNear = 4096;  // bf16 values (8 KB) between the pair read and the one prefetched in one pass

// Every row of xs (M of them) against one strip: passes of kTile rows, then the remaining 1 to kTile - 1 rows.
// With more than one pass the strip is read from memory once and from the caches after. The passes prefetch the
// thread's next full strip (`next`; nullptr: none), each a share of its pairs in proportion to its rows, so that
// reading it spans all of this strip's products: prefetched by the first pass alone (at its pace, which the memory
// cannot keep), a 16-row product of the 125M model's linears took 1.46-1.62x its time on weights already in the
// caches, spread 1.25-1.51x (perf/ISSUE16.md). With one pass (M <= kTile: memory-bound) a full strip prefetches its
// own stream kNear values ahead, on into the strips after it (Prefetch says what that gained). Past a thread's strips
// or the weight's end that is a few KB of spare reads (a prefetch never faults).
template <bool kFull, int64_t TT>
void strip_rows(const uint16_t* strip, const uint16_t* xs, int64_t M, int64_t Kp, int64_t cols, float* out,
                int64_t ldo, const at::BFloat16* bias, const uint16_t* next, PoolLines* lines) {
  const auto bytes = [](const uint16_t* w) { return reinterpret_cast<const char*>(w); };
  int64_t shared = 0;  // pairs of `next` the passes before prefetched
  const auto share = [&](int64_t rows) {  // what a pass of `rows` rows prefetches
    if (M <= kTile) return kFull ? Prefetch{bytes(strip + kNear), 1, 1, true} : Prefetch{};  // (bf16_gemv: no lines)
    if (next == nullptr) return Prefetch{nullptr, 1, 1, false, lines};
    const Prefetch pf{bytes(next) + shared * kPairBytes, rows, M, false, lines};
    shared += Kp / 2 * rows / M;
    return pf;
  };
  int64_t m = 0;
  for (; m + kTile <= M; m += kTile)
    strip_dots<kFull, kTile, TT>(strip, xs + m * Kp, Kp, cols, out + m * ldo, ldo, bias, share(kTile));
  const uint16_t* x = xs + m * Kp;
  float* o = out + m * ldo;
  switch (M - m) {
    case 5: strip_dots<kFull, 5, TT>(strip, x, Kp, cols, o, ldo, bias, share(5)); break;
    case 4: strip_dots<kFull, 4, TT>(strip, x, Kp, cols, o, ldo, bias, share(4)); break;
    case 3: strip_dots<kFull, 3, TT>(strip, x, Kp, cols, o, ldo, bias, share(3)); break;
    case 2: strip_dots<kFull, 2, TT>(strip, x, Kp, cols, o, ldo, bias, share(2)); break;
    case 1: strip_dots<kFull, 1, TT>(strip, x, Kp, cols, o, ldo, bias, share(1)); break;
    default: break;
  }
}

// This thread's range [first, first + size) of an at::parallel_for over n items, grain 1: its static ranges (OpenMP:
// as many threads as items allow, divup(n, threads) items each) put each thread at the same place in every call.
std::pair<int64_t, int64_t> thread_range(int64_t n) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n), size = (n + threads - 1) / threads;
  return {at::get_thread_num() * size, size};
}

// Where this thread's first strip of a product of `strips` lies (thread_range).
int64_t first_strip(int64_t strips) { return thread_range(strips).first; }

// This thread's share of `ahead`: the sequences paged_decode's at::parallel_for over them gives the same thread
// number (thread_range), so that their lines come to the core that attends to them.
PoolLines thread_lines(const PoolRowsAhead* ahead) {
  if (ahead == nullptr || ahead->B == 0) return PoolLines();
  const auto [first, size] = thread_range(ahead->B);
  return PoolLines(*ahead, first, first + size);
}

}  // namespace

bool bf16_gemv_available() { return true; }

// then: the next linear's interleaved weight (or empty). A thread's last strip here asks for the first full strip that
// thread takes there, as its other strips ask for their next one: the next product then starts on weights in L2
// instead of from memory (its first strip of every thread was read on demand; 0.98-0.985x the 125M model's batch-16
// decode step, perf/ISSUE16.md).
// ahead: pool rows whose lines the passes ask for, one a pair (pool_lines.h), or nullptr.
torch::Tensor bf16_gemv(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                        const torch::Tensor& then, const PoolRowsAhead* ahead) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kGemvMaxRows && x.scalar_type() == at::kFloat,
              "bf16_gemv: x (M, K) float32 with 1 <= M <= ", kGemvMaxRows);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
                  packed.size(1) % 2 == 0, "bf16_gemv: packed (N, K padded to 2) bfloat16, interleaved");
  const int64_t M = x.size(0), N = packed.size(0), Kp = packed.size(1), K = x.size(1);
  TORCH_CHECK(K <= Kp && Kp - K < 2, "bf16_gemv: x has ", K, " columns, the weight ", Kp, " (padded)");
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.numel() == N && bias.scalar_type() == at::kBFloat16 && bias.is_contiguous()),
              "bf16_gemv: bias (N,) bfloat16");
  const bool has_then = then.defined() && then.numel() > 0;
  TORCH_CHECK(!has_then || (then.dim() == 2 && then.scalar_type() == at::kBFloat16 && then.is_contiguous()),
              "bf16_gemv: then (N', K' padded to 2) bfloat16, interleaved");
  // x rounded to bf16 as PrepackedLinear rounds it, zero past K (the padded weight column is zero too): (M, Kp),
  // in this thread's buffer (kept between calls; the other threads only read it)
  const auto xc = x.stride(1) == 1 ? x : x.contiguous();
  static thread_local std::vector<uint16_t> x_bf16;
  x_bf16.resize(M * Kp);
  round_rows(xc.data_ptr<float>(), M, K, xc.stride(0), x_bf16.data(), Kp);
  auto y = torch::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const uint16_t* xv = x_bf16.data();
  const at::BFloat16* b = has_bias ? bias.data_ptr<at::BFloat16>() : nullptr;
  const auto* then_w = has_then ? reinterpret_cast<const uint16_t*>(then.data_ptr<at::BFloat16>()) : nullptr;
  const int64_t strips = (N + kStrip - 1) / kStrip;
  // Up to kTile rows the product is one pass at the memory's read rate: no room for more reads (125M, one row: 1.01x
  // the step with them)
  if (M <= kTile) ahead = nullptr;
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    PoolLines lines = thread_lines(ahead);
    PoolLines* more = lines.done() ? nullptr : &lines;
    for (int64_t s = begin; s < end; ++s) {
      const int64_t n0 = s * kStrip, cols = std::min(kStrip, N - n0);
      const uint16_t* strip = w + n0 * Kp;
      const at::BFloat16* bias_cols = b ? b + n0 : nullptr;
      // the next strip, where it is a full one of this thread's; after its last, its first of `then`
      const uint16_t* next = s + 1 < end && n0 + 2 * kStrip <= N ? w + (n0 + kStrip) * Kp : nullptr;
      if (s + 1 == end && has_then) {
        const int64_t then_n = then.size(0), first = first_strip((then_n + kStrip - 1) / kStrip);
        if ((first + 1) * kStrip <= then_n) next = then_w + first * kStrip * then.size(1);
      }
      if (cols == kStrip) {
        strip_rows<true, kStripTiles>(strip, xv, M, Kp, cols, yp + n0, N, bias_cols, next, more);
        continue;
      }
      switch ((cols + kLanes - 1) / kLanes) {  // the last strip: 1 to 63 columns
        case 4: strip_rows<false, 4>(strip, xv, M, Kp, cols, yp + n0, N, bias_cols, nullptr, more); break;
        case 3: strip_rows<false, 3>(strip, xv, M, Kp, cols, yp + n0, N, bias_cols, nullptr, more); break;
        case 2: strip_rows<false, 2>(strip, xv, M, Kp, cols, yp + n0, N, bias_cols, nullptr, more); break;
        default: strip_rows<false, 1>(strip, xv, M, Kp, cols, yp + n0, N, bias_cols, nullptr, more); break;
      }
    }
  });
  return y;
}

#else  // no AVX-512 BF16: every bf16 linear stays on oneDNN

bool bf16_gemv_available() { return false; }

torch::Tensor bf16_gemv(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                        const PoolRowsAhead*) {
  TORCH_CHECK(false, "bf16_gemv: built without AVX-512 BF16 (this CPU has none)");
}

#endif
