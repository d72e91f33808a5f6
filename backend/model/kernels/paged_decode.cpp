// Decode attention over a paged KV cache, read in place: one query token per sequence, float32 queries and
// arithmetic, K/V pools in float32 or bfloat16 (each bf16 value widened on load: exact, so a bf16 pool gives the
// same result as its float32 widening), CPU.
//
// The torch path gathers each sequence's context out of the pool (index_select: a copy of every K and V row a
// layer reads), then runs SDPA on the copy. Here each sequence reads its context rows where they lie in the pool,
// scores every query head against each row (eight rows at a time: 16-wide FMA chains with AVX-512, 8-wide with
// AVX2), softmaxes in float32 and sums the V rows: the same bytes read once, no copy, no mask tensor. The query
// heads that share a KV head share its loads: up to three heads score each K chunk together, and the V rows are
// weighed KV head by KV head with the sums in registers. The rows are asked for ahead of their use (prefetch_rows):
// in a served step they come from memory, not the caches. Against the previous version at the demo model's and a
// 125M Llama's decode shapes: 0.7-0.9x in the caches, 0.45-0.85x from memory; in the engine's decode step at batch
// 16, 0.86x (demo) and 0.93x (125M) of the whole step (perf/ISSUE16.md, "The decode attention's memory reads").
// Built by backend/model/kernels/build.py.
#include "kernels.h"

#include <ATen/Parallel.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// A pool element as float32: itself, or a bf16's 16 bits as a float32's top half (exact).
inline float widen(float x) { return x; }
inline float widen(at::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// A pool row as float32: the row itself, or (bf16) its widening into buf. Everything after runs the float32 code,
// so a bf16 pool gives bit for bit what its float32 copy gives.
inline const float* as_float(const float* row, int64_t, float*) { return row; }
inline const float* as_float(const at::BFloat16* row, int64_t n, float* buf) {
  for (int64_t i = 0; i < n; ++i) buf[i] = widen(row[i]);
  return buf;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // eight bf16 -> eight float32, exact
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {  // sixteen bf16 -> sixteen float32, exact
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// The eight row sums of eight 8-wide FMA chains folded into one vector with horizontal adds: lane r = the sum of
// acc[r]'s lanes.
inline __m256 row_sums(const __m256* acc) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  // u0 = [r0 r1 r2 r3 | r0 r1 r2 r3] halves (low lanes, high lanes), u1 likewise for r4..r7
  const __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20), hi = _mm256_permute2f128_ps(u0, u1, 0x31);
  return _mm256_add_ps(lo, hi);
}

inline void store_row_sums(const __m256* acc, float* out) { _mm256_storeu_ps(out, row_sums(acc)); }

// Eight rows' dot products with one query head, D a multiple of 8: one 8-wide FMA chain per row (eight chains side
// by side), then store_row_sums. out[r] = q . rows[r].
template <typename T>
inline void dot8(const float* q, const T* const* rows, int64_t D, float* out) {
  __m256 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qd, load8(rows[r] + d), acc[r]);
  }
  store_row_sums(acc, out);
}
constexpr bool kHaveDot8 = true;
#else
template <typename T>
inline void dot8(const float* q, const T* const* rows, int64_t D, float* out) {  // not called: kHaveDot8
  std::vector<float> buf(D);
  for (int r = 0; r < 8; ++r) out[r] = dot(q, as_float(rows[r], D, buf.data()), D);
}
constexpr bool kHaveDot8 = false;
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__AVX512F__)
// dot8 for two query heads of one KV head at once: each K chunk is loaded (and a bf16 one widened) once for both.
// Each head's eight FMA chains and its row sums are dot8's, so each out[] is bit for bit what dot8 gives. 19 of the
// 32 vector registers AVX-512 gives (16 AVX2 alone would spill): AVX-512 machines only.
template <typename T>
inline void dot8x2(const float* qa, const float* qb, const T* const* rows, int64_t D, float* outa, float* outb) {
  __m256 a[8], b[8];
  for (int r = 0; r < 8; ++r) a[r] = b[r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qda = _mm256_loadu_ps(qa + d), qdb = _mm256_loadu_ps(qb + d);
    for (int r = 0; r < 8; ++r) {
      const __m256 k = load8(rows[r] + d);
      a[r] = _mm256_fmadd_ps(qda, k, a[r]);
      b[r] = _mm256_fmadd_ps(qdb, k, b[r]);
    }
  }
  store_row_sums(a, outa);
  store_row_sums(b, outb);
}
constexpr bool kHaveDot8x2 = true;
#else
template <typename T>
inline void dot8x2(const float*, const float*, const T* const*, int64_t, float*, float*) {}  // not called
constexpr bool kHaveDot8x2 = false;
#endif

// How many of the `left` query heads still to do of one KV head go together (at most 3, registers allow no more):
// 4 as 2 + 2 rather than 3 + 1, so no pass runs one head alone.
inline int64_t heads_at_once(int64_t left) { return left == 4 ? 2 : std::min<int64_t>(left, 3); }

#if defined(__AVX512F__)
// Eight rows' dot products with NH query heads of one KV head at once, D a multiple of 16, times the attention scale:
// out[h][r] = (q_h . rows[r]) * scale. One 16-wide FMA chain per row and head (each K chunk loaded, and a bf16 one
// widened, once for the NH heads), then each chain's two halves added and row_sums' tree: 8 NH + NH + 1 of the 32
// vector registers for NH <= 3. Half the FMAs and loads of dot8x2's 8-wide chains, and the scores leave as one
// vector store per head (perf/ISSUE16.md, "The decode attention's memory reads").
template <typename T, int NH>
inline void dot16(const float* const* q, const T* const* rows, int64_t D, float scale, float* const* out) {
  __m512 acc[NH][8];
  for (int h = 0; h < NH; ++h)
    for (int r = 0; r < 8; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    __m512 qd[NH];
    for (int h = 0; h < NH; ++h) qd[h] = _mm512_loadu_ps(q[h] + d);
    for (int r = 0; r < 8; ++r) {
      const __m512 k = load16(rows[r] + d);
      for (int h = 0; h < NH; ++h) acc[h][r] = _mm512_fmadd_ps(qd[h], k, acc[h][r]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int h = 0; h < NH; ++h) {
    __m256 halves[8];
    for (int r = 0; r < 8; ++r) {
      const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[h][r]), 1));
      halves[r] = _mm256_add_ps(_mm512_castps512_ps256(acc[h][r]), hi);
    }
    _mm256_storeu_ps(out[h], _mm256_mul_ps(row_sums(halves), sc));
  }
}

// Scores (H, n) of eight rows starting at column j, every query head, KV head by KV head (dot16 over up to three of
// its heads at once). k8: the eight rows' first elements.
template <typename T>
inline void score_rows16(const float* qb, const T* const* k8, int64_t H, int64_t G, int64_t D, int64_t n, int64_t j,
                         float scale, float* scores) {
  for (int64_t h = 0; h < H;) {
    const int64_t off = (h / G) * D, left = heads_at_once(G - h % G);
    const T* kh[8];
    for (int r = 0; r < 8; ++r) kh[r] = k8[r] + off;
    const float* q[3];  // the first `left` entries: the heads of this pass
    float* out[3];
    for (int64_t i = 0; i < left; ++i) q[i] = qb + (h + i) * D, out[i] = scores + (h + i) * n + j;
    if (left == 3) dot16<T, 3>(q, kh, D, scale, out);
    else if (left == 2) dot16<T, 2>(q, kh, D, scale, out);
    else dot16<T, 1>(q, kh, D, scale, out);
    h += left;
  }
}
constexpr bool kHaveDot16 = true;
#else
template <typename T>
inline void score_rows16(const float*, const T* const*, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                         float*) {}  // not called: kHaveDot16
constexpr bool kHaveDot16 = false;
#endif

// score_rows16's work in 8-wide chains (AVX2): two heads of a KV head at once where dot8x2 exists (K read once),
// else one.
template <typename T>
inline void score_rows8(const float* qb, const T* const* k8, int64_t H, int64_t G, int64_t D, int64_t n, int64_t j,
                        float scale, float* scores) {
  float s8[8], s8b[8];
  for (int64_t h = 0; h < H;) {
    const int64_t off = (h / G) * D;
    const T* kh[8];
    for (int r = 0; r < 8; ++r) kh[r] = k8[r] + off;
    if (kHaveDot8x2 && h + 1 < H && (h + 1) / G == h / G) {
      dot8x2(qb + h * D, qb + (h + 1) * D, kh, D, s8, s8b);
      for (int r = 0; r < 8; ++r) {
        scores[h * n + j + r] = s8[r] * scale;
        scores[(h + 1) * n + j + r] = s8b[r] * scale;
      }
      h += 2;
    } else {
      dot8(qb + h * D, kh, D, s8);
      for (int r = 0; r < 8; ++r) scores[h * n + j + r] = s8[r] * scale;
      h += 1;
    }
  }
}

// y += p * x over n elements (the compiler contracts it to FMAs: -march=native, GCC's default -ffp-contract=fast).
inline void axpy(float p, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
}

// The same for a bf16 x, widened as it is loaded, with the same FMAs (bit for bit the float32 widening's result).
inline void axpy(float p, const at::BFloat16* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 pv16 = _mm512_set1_ps(p);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(pv16, load16(x + i), _mm512_loadu_ps(y + i)));
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, load8(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(p, widen(x[i]), y[i]);
}

// exp(x) for x <= 0 in straight-line arithmetic the compiler vectorizes (std::exp is a scalar call):
// x = k ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor series to r^7 (truncation < 6e-9), times 2^k from the
// exponent bits. Below -87 the result is 0 (float32's smallest normal is exp(-87.3)).
inline float exp_nonpositive(float x) {
  const float k = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;  // ln2 split: exact k * hi
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.f ? 0.f : p * scale;
}

#if defined(__AVX512F__)
// out (HS heads x DC * 16 columns) = sum over the n rows of p[h][j] * v_j, with the accumulators in registers and
// each V chunk loaded (widened) once for the HS query heads that share its KV head. Fewer than 8 chains (HS x DC)
// wait on the FMA's latency (4 cycles, one chain's FMA after another's): then rows go in pairs, even rows into one
// set of accumulators and odd rows into another, added at the end (U = 2); otherwise one FMA per element per row,
// in order (U = 1). p: HS rows of n probabilities, stride n; vrow(j): row j's first element of this KV head's
// column chunk.
template <typename T, int HS, int DC, typename RowAt>
inline void accumulate_block(const float* p, int64_t n, RowAt vrow, float* out, int64_t out_stride) {
  constexpr int U = HS * DC < 8 ? 2 : 1;
  __m512 acc[U][HS][DC];
  for (int u = 0; u < U; ++u)
    for (int h = 0; h < HS; ++h)
      for (int c = 0; c < DC; ++c) acc[u][h][c] = _mm512_setzero_ps();
  auto add_row = [&](int u, int64_t j) {
    const T* v = vrow(j);
    __m512 vv[DC];
    for (int c = 0; c < DC; ++c) vv[c] = load16(v + 16 * c);
    for (int h = 0; h < HS; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * n + j]);
      for (int c = 0; c < DC; ++c) acc[u][h][c] = _mm512_fmadd_ps(ph, vv[c], acc[u][h][c]);
    }
  };
  int64_t j = 0;
  for (; j + U <= n; j += U)
    for (int u = 0; u < U; ++u) add_row(u, j + u);
  for (; j < n; ++j) add_row(0, j);
  for (int h = 0; h < HS; ++h)
    for (int c = 0; c < DC; ++c) {
      __m512 sum = acc[0][h][c];
      for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[u][h][c]);
      _mm512_storeu_ps(out + h * out_stride + 16 * c, sum);
    }
}

template <typename T, int HS, typename RowAt>
inline void accumulate_heads(const float* p, int64_t n, int64_t dc, RowAt vrow, float* out, int64_t out_stride) {
  switch (dc) {
    case 1: accumulate_block<T, HS, 1>(p, n, vrow, out, out_stride); break;
    case 2: accumulate_block<T, HS, 2>(p, n, vrow, out, out_stride); break;
    case 3: accumulate_block<T, HS, 3>(p, n, vrow, out, out_stride); break;
    default: accumulate_block<T, HS, 4>(p, n, vrow, out, out_stride); break;
  }
}
#endif

// acc (H, D) = probabilities (H, n) times the V rows, per query head: each element summed over the rows in order
// with one FMA per row (axpy's arithmetic). With AVX-512 and D a multiple of 16: KV head by KV head, up to three
// query heads and 64 columns at a time in registers, rows in pairs where that leaves fewer than 8 FMA chains
// (accumulate_block; perf/ISSUE16.md: the per-head axpy loaded and stored its accumulators for every row).
template <typename T>
void weigh_values(const float* probs, const T* vp, const int64_t* rows, int64_t n, int64_t H, int64_t G, int64_t D,
                  int64_t row, float* acc) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    int64_t hs;  // query heads h0 .. h0 + hs - 1, of one KV head
    for (int64_t h0 = 0; h0 < H; h0 += hs) {
      hs = heads_at_once(G - h0 % G);
      const int64_t off = (h0 / G) * D;
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        const int64_t dc = std::min<int64_t>(64, D - d0) / 16;
        auto vrow = [&](int64_t j) { return vp + rows[j] * row + off + d0; };
        if (hs == 3) accumulate_heads<T, 3>(probs + h0 * n, n, dc, vrow, acc + h0 * D + d0, D);
        else if (hs == 2) accumulate_heads<T, 2>(probs + h0 * n, n, dc, vrow, acc + h0 * D + d0, D);
        else accumulate_heads<T, 1>(probs + h0 * n, n, dc, vrow, acc + h0 * D + d0, D);
      }
    }
    return;
  }
#endif
  std::fill(acc, acc + H * D, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const T* v = vp + rows[j] * row;
    for (int64_t h = 0; h < H; ++h) axpy(probs[h * n + j], v + (h / G) * D, acc + h * D, D);
  }
}

// scores (rows, n) -> softmax per row, in place.
void softmax_rows(float* scores, int64_t rows, int64_t n) {
  for (int64_t h = 0; h < rows; ++h) {
    float* s = scores + h * n;
    float m = -std::numeric_limits<float>::infinity();
    // A max reduction the compiler vectorizes (std::max's loop stayed scalar: a quarter of the kernel's time at the
    // demo model's shapes, perf/ISSUE16.md). A NaN score makes the row NaN whichever maximum is taken.
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_nonpositive(s[j] - m);
      sum += s[j];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  }
}

// Asks for pool rows [j0, min(j1, n)) of a sequence ahead of their use, every cache line of each row (into L2:
// the QK pass and the value pass read them soon after). The rows of a step's context are scattered over the pool in
// 32-row blocks and, past the caches' size (the weights of a step evict them), come from memory: read on demand they
// arrived at ~3-5 GB/s, one or two lines at a time (perf/ISSUE16.md, "The decode attention's memory reads").
template <typename T>
inline void prefetch_rows(const T* pool, const int64_t* rows, int64_t j0, int64_t j1, int64_t n, int64_t row) {
  const int64_t bytes = row * static_cast<int64_t>(sizeof(T));
  for (int64_t j = j0; j < std::min(j1, n); ++j) {
    const char* first = reinterpret_cast<const char*>(pool + rows[j] * row);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b, 0, 2);
    __builtin_prefetch(first + bytes - 1, 0, 2);  // the last line, where a row does not start on a line
  }
}

// paged_decode's work once its arguments are checked: T is the pools' element type.
template <typename T>
void attend_pages(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& slots, const torch::Tensor& col_start, const torch::Tensor& col_end,
                  double scale, double softcap, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1), L = slots.size(1);
  const int64_t G = H / KV;
  const float* qp = q.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* cs = col_start.data_ptr<int64_t>();
  const int64_t* ce = col_end.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale), cap = static_cast<float>(softcap);
  // Work item: one sequence. Its context rows are read whole (every KV head's D floats lie together in a row),
  // once for K and once for V, each row scored against all H query heads: one pass over the bytes.
  const int64_t row = KV * D;
  constexpr int64_t kAhead = 32;  // K rows asked for ahead of the row being scored
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(H * D), wide(row);  // wide: a bf16 pool's row as float32
    for (int64_t b = begin; b < end; ++b) {
      const int64_t c0 = cs[b], n = ce[b] - c0;
      const int64_t* rows = sp + b * L + c0;
      if (b == begin) prefetch_rows(kp, rows, 0, kAhead, n, row);  // later sequences: asked for by the one before
      const float* qb = qp + b * H * D;
      scores.resize(H * n);
      int64_t j = 0;
      const bool wide16 = kHaveDot16 && D % 16 == 0;
      if (wide16 || (kHaveDot8 && D % 8 == 0)) {  // eight rows at a time: 16-wide chains on AVX-512, else 8-wide
        const T* k8[8];
        for (; j + 8 <= n; j += 8) {
          for (int r = 0; r < 8; ++r) k8[r] = kp + rows[j + r] * row;
          prefetch_rows(kp, rows, j + kAhead, j + kAhead + 8, n, row);  // K rows ahead of the scores
          prefetch_rows(vp, rows, j, j + 8, n, row);  // these rows' V, for the value pass after the softmax
          if (wide16) score_rows16(qb, k8, H, G, D, n, j, sc, scores.data());
          else score_rows8(qb, k8, H, G, D, n, j, sc, scores.data());
        }
      }
      prefetch_rows(vp, rows, j, n, n, row);
      if (b + 1 < end) prefetch_rows(kp, sp + (b + 1) * L + cs[b + 1], 0, kAhead, ce[b + 1] - cs[b + 1], row);
      for (; j < n; ++j) {
        const float* k = as_float(kp + rows[j] * row, row, wide.data());
        for (int64_t h = 0; h < H; ++h) scores[h * n + j] = dot(qb + h * D, k + (h / G) * D, D) * sc;
      }
      if (cap > 0.f) {  // Gemma 2's soft cap (a scalar loop: tanh)
        for (int64_t i = 0; i < H * n; ++i) scores[i] = std::tanh(scores[i] / cap) * cap;
      }
      softmax_rows(scores.data(), H, n);
      weigh_values(scores.data(), vp, rows, n, H, G, D, row, acc.data());
      std::copy(acc.begin(), acc.end(), op + b * H * D);
    }
  });
}

}  // namespace

// q (B, H, D) float32; k_cache, v_cache (S, KV, D) contiguous, both float32 or both bfloat16; slots (B, L) int64:
// pool row of each context column; col_start, col_end (B,) int64: the columns [start, end) each sequence attends
// to (its window), end > start; softcap <= 0: none, else scores = tanh(scores / softcap) * softcap (Gemma 2).
// Returns (B, H, D) float32.
torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& slots, const torch::Tensor& col_start, const torch::Tensor& col_end,
                           double scale, double softcap) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "paged_decode: shapes");
  const auto pool = k_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == at::kFloat && v_cache.scalar_type() == pool &&
                  (pool == at::kFloat || pool == at::kBFloat16),
              "paged_decode: float32 queries, and float32 or bfloat16 pools (K and V alike)");
  TORCH_CHECK(slots.scalar_type() == at::kLong && col_start.scalar_type() == at::kLong &&
                  col_end.scalar_type() == at::kLong, "paged_decode: int64 indices");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() && slots.is_contiguous() &&
                  col_start.is_contiguous() && col_end.is_contiguous(), "paged_decode: contiguous tensors");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = k_cache.size(1), L = slots.size(1);
  TORCH_CHECK(k_cache.size(2) == D && H % KV == 0 && slots.size(0) == B && col_start.size(0) == B &&
                  col_end.size(0) == B, "paged_decode: shapes");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* cs = col_start.data_ptr<int64_t>();
  const int64_t* ce = col_end.data_ptr<int64_t>();
  const int64_t S = k_cache.size(0);
  for (int64_t b = 0; b < B; ++b) {  // a bad index would read outside the pool: refuse it instead
    TORCH_CHECK(0 <= cs[b] && cs[b] < ce[b] && ce[b] <= L, "paged_decode: column range of sequence ", b);
    for (int64_t c = cs[b]; c < ce[b]; ++c) {
      TORCH_CHECK(0 <= sp[b * L + c] && sp[b * L + c] < S, "paged_decode: slot outside the pool, sequence ", b);
    }
  }
  auto out = torch::empty_like(q);
  if (pool == at::kBFloat16) {
    attend_pages<at::BFloat16>(q, k_cache, v_cache, slots, col_start, col_end, scale, softcap, out);
  } else {
    attend_pages<float>(q, k_cache, v_cache, slots, col_start, col_end, scale, softcap, out);
  }
  return out;
}
