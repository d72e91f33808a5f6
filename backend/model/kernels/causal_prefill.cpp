// Causal self-attention of prompts whose context is their own new tokens (a prefill from position 0), in bf16
// products with float32 accumulation and a float32 softmax, for CPUs with AVX-512 BF16 (VDPBF16PS), as
// flash attention computes it: per query row a running maximum and sum over key blocks, no score matrix in memory.
//
// Where it runs: bf16 K/V pools beside bf16 linears (decoder.Attention), where K and V are bf16 already; queries
// and the softmax's probabilities are rounded to bf16 for the products (what a bf16 checkpoint's own attention
// does), every sum in float32. torch's CPU flash attention on float32 computes the same at about a third of the
// speed (perf/ISSUE16.md). Built by backend/model/kernels/build.py; without AVX-512 BF16 it is not compiled and
// causal_prefill_available() says so.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int64_t kBlock = 32;  // keys per block: two 16-lane score vectors per query row

// 2^x for x <= 0, float32: x = k + r, |r| <= 1/2, 2^r by its Taylor series to r^7 (relative error < 1e-8), then
// scaled by 2^k (VSCALEFPS). Below -126 it is clamped: the lanes masked off are zeroed by the caller.
inline __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_mul_ps(_mm512_sub_ps(x, k), _mm512_set1_ps(0.6931471805599453f));  // r ln 2
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, k);
}

// One sequence's K and V for one KV head, laid out for VDPBF16PS (which multiplies bf16 pairs):
//   k: (blocks, D / 2, 32) int32, each a pair (k[j][2e], k[j][2e + 1]): 32 keys' pair e side by side;
//   v: (blocks * 16, D) int32, each a pair (v[2i][d], v[2i + 1][d]): 16 value channels' key pair i side by side.
// Keys past the sequence's end are zeros (their probabilities are zeroed too).
struct PackedHead {
  const int32_t* k;
  const int32_t* v;
};

uint16_t bits(const at::BFloat16& x) { return x.x; }
int32_t pair(uint16_t lo, uint16_t hi) { return static_cast<int32_t>(static_cast<uint32_t>(hi) << 16 | lo); }

void pack_head(const at::BFloat16* k, const at::BFloat16* v, int64_t n, int64_t row, int64_t D, int32_t* kp,
               int32_t* vp) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::fill(kp, kp + blocks * kBlock * D / 2, 0);
  std::fill(vp, vp + blocks * kBlock * D / 2, 0);
  for (int64_t j = 0; j < n; ++j) {  // key j: row j * row (the flat token's KV heads), this head's D values
    const at::BFloat16* kj = k + j * row;
    int32_t* kb = kp + (j / kBlock) * (D / 2) * kBlock + j % kBlock;
    for (int64_t e = 0; e < D / 2; ++e) kb[e * kBlock] = pair(bits(kj[2 * e]), bits(kj[2 * e + 1]));
  }
  uint16_t* vh = reinterpret_cast<uint16_t*>(vp);  // pair (j, j + 1) of channel d: halves 2 ((j / 2) D + d) + j % 2
  for (int64_t j = 0; j < n; ++j) {
    const at::BFloat16* vj = v + j * row;
    for (int64_t d = 0; d < D; ++d) vh[2 * ((j / 2) * D + d) + j % 2] = bits(vj[d]);
  }
}

// R query rows (rows i0 .. i0 + R - 1 of one sequence, one query head) against every key block they see.
// q: the rows' bf16 pairs (R pointers to D / 2 int32); out: R pointers to D float32.
template <int D, int R>
void attend_rows(const int32_t* const* q, const PackedHead& kv, int64_t i0, int64_t n, float scale_log2,
                 float* const* out) {
  constexpr int DV = D / 16;  // output vectors per row
  __m512 acc[R][DV];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.f;
    for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const int64_t last = std::min(i0 + R, n) - 1;  // the last row's keys: 0 .. last
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  alignas(64) int32_t probs[R][16];
  for (int64_t b = 0; b * kBlock <= last; ++b) {
    const int32_t* kb = kv.k + b * (D / 2) * kBlock;
    __m512 s[R][2];
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm512_setzero_ps();
    for (int e = 0; e < D / 2; ++e) {
      const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kb + e * kBlock);
      const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kb + e * kBlock + 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh qe = (__m512bh)_mm512_set1_epi32(q[r][e]);
        s[r][0] = _mm512_dpbf16_ps(s[r][0], k0, qe);
        s[r][1] = _mm512_dpbf16_ps(s[r][1], k1, qe);
      }
    }
    const bool diagonal = (b + 1) * kBlock > i0;  // some key of this block lies after some row
    for (int r = 0; r < R; ++r) {
      const int64_t i = std::min(i0 + r, n - 1);  // rows past the end repeat the last (not stored)
      __mmask16 keep[2] = {0xFFFF, 0xFFFF};
      if (diagonal) {
        const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(i - b * kBlock));  // keys j <= i
        keep[0] = _mm512_cmple_epi32_mask(lane, limit);
        keep[1] = _mm512_cmple_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16)), limit);
      }
      const __m512 neg = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      const __m512 s0 = _mm512_mask_mul_ps(neg, keep[0], s[r][0], _mm512_set1_ps(scale_log2));
      const __m512 s1 = _mm512_mask_mul_ps(neg, keep[1], s[r][1], _mm512_set1_ps(scale_log2));
      const float m_new = std::max(m[r], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
      const __m512 mv = _mm512_set1_ps(m_new);
      const __m512 p0 = _mm512_maskz_mov_ps(keep[0], exp2_nonpositive(_mm512_sub_ps(s0, mv)));
      const __m512 p1 = _mm512_maskz_mov_ps(keep[1], exp2_nonpositive(_mm512_sub_ps(s1, mv)));
      if (m_new > m[r]) {  // a new maximum: what was summed so far shrinks by 2^(m - m_new) (0 before any key)
        const float alpha = m[r] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp2(m[r] - m_new);
        l[r] *= alpha;
        const __m512 av = _mm512_set1_ps(alpha);
        for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], av);
        m[r] = m_new;
      }
      l[r] += _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
      _mm512_store_si512(probs[r], (__m512i)_mm512_cvtne2ps_pbh(p1, p0));  // 32 bf16: key pairs 0..15
    }
    const int32_t* vb = kv.v + b * (kBlock / 2) * D;
    for (int i = 0; i < kBlock / 2; ++i) {
      __m512bh vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = (__m512bh)_mm512_loadu_si512(vb + i * D + 16 * c);
      for (int r = 0; r < R; ++r) {
        const __m512bh pr = (__m512bh)_mm512_set1_epi32(probs[r][i]);
        for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], vv[c], pr);
      }
    }
  }
  for (int r = 0; r < R && i0 + r < n; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / l[r]);
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(out[r] + 16 * c, _mm512_mul_ps(acc[r][c], inv));
  }
}

struct Item {
  int64_t seq, head, row0;
};

template <int D, int R>
void run(const torch::Tensor& qb, const torch::Tensor& k, const torch::Tensor& v, const int64_t* seqs, int64_t B,
         double scale, torch::Tensor& out) {
  const int64_t H = qb.size(1), KV = k.size(1), G = H / KV, row = KV * D;
  // Packed K/V of every (sequence, KV head): offsets into one buffer.
  std::vector<int64_t> offset(B * KV + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t padded = (seqs[2 * b + 1] + kBlock - 1) / kBlock * kBlock;
    for (int64_t g = 0; g < KV; ++g) offset[b * KV + g + 1] = offset[b * KV + g] + padded * D / 2;
  }
  // Left uninitialised here (new T[n], not make_unique's zeroing): pack_head writes every element, padding zeros
  // included. C++17: torch builds extensions with -std=c++17 before 2.13 (make_unique_for_overwrite is C++20).
  const std::unique_ptr<int32_t[]> kpack(new int32_t[offset.back()]);
  const std::unique_ptr<int32_t[]> vpack(new int32_t[offset.back()]);
  const auto* kp = k.data_ptr<at::BFloat16>();
  const auto* vp = v.data_ptr<at::BFloat16>();
  const int nthreads = at::get_num_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t bg = 0; bg < B * KV; ++bg) {
    const int64_t b = bg / KV, g = bg % KV, first = seqs[2 * b];
    pack_head(kp + first * row + g * D, vp + first * row + g * D, seqs[2 * b + 1], row, D,
              kpack.get() + offset[bg], vpack.get() + offset[bg]);
  }
  // Work items: 48 query rows (a multiple of every R) of one head of one sequence, the longest (latest rows) first
  // for balance.
  constexpr int64_t kRows = 48;
  static_assert(kRows % R == 0, "a work item's rows are whole tiles");
  std::vector<Item> items;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r0 = 0; r0 < seqs[2 * b + 1]; r0 += kRows) {
      for (int64_t h = 0; h < H; ++h) items.push_back({b, h, r0});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.row0 > y.row0; });
  const int32_t* qp = reinterpret_cast<const int32_t*>(qb.data_ptr<at::BFloat16>());
  float* op = out.data_ptr<float>();
  const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t w = 0; w < n_items; ++w) {
    const Item it = items[w];
    const int64_t first = seqs[2 * it.seq], n = seqs[2 * it.seq + 1], g = it.head / G;
    const PackedHead kv{kpack.get() + offset[it.seq * KV + g], vpack.get() + offset[it.seq * KV + g]};
    for (int64_t i0 = it.row0; i0 < std::min(it.row0 + kRows, n); i0 += R) {
      const int32_t* q[R];
      float* o[R];
      for (int r = 0; r < R; ++r) {
        const int64_t t = first + std::min(i0 + r, n - 1);
        q[r] = qp + (t * H + it.head) * (D / 2);
        o[r] = op + (t * H + it.head) * D;
      }
      attend_rows<D, R>(q, kv, i0, n, scale_log2, o);
    }
  }
}

}  // namespace

bool causal_prefill_available() { return true; }

torch::Tensor causal_prefill(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& seqs, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes(), "causal_prefill: q (T, H, D), k/v (T, KV, D)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "causal_prefill: float32 queries, bfloat16 keys and values");
  TORCH_CHECK(seqs.scalar_type() == at::kLong && seqs.dim() == 2 && seqs.size(1) == 2,
              "causal_prefill: seqs (B, 2) int64");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && seqs.is_contiguous(),
              "causal_prefill: contiguous tensors");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KV = k.size(1), B = seqs.size(0);
  TORCH_CHECK(k.size(0) == T && k.size(2) == D && KV > 0 && H % KV == 0, "causal_prefill: shapes");
  const int64_t* sp = seqs.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {  // a bad range would read outside q, k, v: refuse it instead
    TORCH_CHECK(sp[2 * b] >= 0 && sp[2 * b + 1] > 0 && sp[2 * b] + sp[2 * b + 1] <= T,
                "causal_prefill: token range of sequence ", b);
  }
  auto qb = q.to(at::kBFloat16);  // round to nearest even, as a bf16 checkpoint's queries are
  auto out = torch::zeros_like(q);
  switch (D) {
    // R: query rows per tile, as many as keep R x D / 16 accumulators and 2 R scores in the 32 vector registers
    // (64: 6 rows measured 15 % faster than 4 and as fast as 8)
    case 16: run<16, 8>(qb, k, v, sp, B, scale, out); break;
    case 32: run<32, 8>(qb, k, v, sp, B, scale, out); break;
    case 64: run<64, 6>(qb, k, v, sp, B, scale, out); break;
    case 80: run<80, 4>(qb, k, v, sp, B, scale, out); break;
    case 96: run<96, 3>(qb, k, v, sp, B, scale, out); break;
    case 128: run<128, 3>(qb, k, v, sp, B, scale, out); break;
    case 256: run<256, 1>(qb, k, v, sp, B, scale, out); break;
    default: TORCH_CHECK(false, "causal_prefill: head size ", D, " (16, 32, 64, 80, 96, 128 or 256)");
  }
  return out;
}

#else  // no AVX-512 BF16: decoder.Attention keeps torch's SDPA

bool causal_prefill_available() { return false; }

torch::Tensor causal_prefill(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                             double) {
  TORCH_CHECK(false, "causal_prefill: built without AVX-512 BF16 (this CPU has none)");
}

#endif
