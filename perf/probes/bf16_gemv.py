"""Is a batch-1 bf16 linear faster than oneDNN's on this CPU? (a measurement, not a test; issue 16's batch-1 floor)

The 125M model's bf16 decode step at batch 1 spends ~85 % of its time in oneDNN's bf16 linears (perf/ISSUE16.md),
which stream the weights at ~20 GB/s where a read on both cores does 30-48. This times, for the 125M model's four
linears of a layer (qkv 1280 x 768, dense 768 x 768, fc+gate 6144 x 768, proj 768 x 3072) with weights cycled
through 12 layers (220 MB: they come from DRAM, as in the engine):
- oneDNN: PrepackedLinear in bf16 (the engine's), x rounded to bf16 and y widened as there;
- gemv R/P: a GEMV on plain row-major bf16 weights with AVX-512 BF16's dot product (vdpbf16ps), R rows of W per
  pass over x, software prefetch P bytes ahead (0: none), OpenMP over row blocks;
- read: a sum over the same bytes (the floor any kernel can reach).
Prints ms per layer (the four linears) and GB/s, median of --passes, interleaved. Needs a CPU with AVX-512 BF16
(the development VM's; the GEMVs do not compile without it).

The kernel this led to is backend/model/kernels/bf16_gemv.cpp (EngineConfig.decode_gemv; it settled on blocks of 4
rows, which streamed faster than 8 or 16 from DRAM); its effect on the engine's decode step:
`perf/probes/config_ab.py --hf perf/out/llama125m --dtype bfloat16 --field decode_gemv --values off on --batch 1`.

    .venv/bin/python perf/probes/bf16_gemv.py [--threads 2] [--passes 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import backend  # noqa: E402,F401 -- first: its OMP_WAIT_POLICY default must precede torch

# isort: split
import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

from backend.model.kernels import build as kernel_build  # noqa: E402
from backend.model.prepacked_linear import PrepackedLinear  # noqa: E402

SOURCE = r"""
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

// R rows of w per pass over x, prefetching P bytes ahead (0: none). Plain: w row-major (N, K). Interleaved: w as
// [N / R][K / 32][R][32], a block's rows 32 values at a time, read strictly in order.
template <int R, int P, bool Interleaved>
static void gemv_rows(const uint16_t* w, const uint16_t* x, float* y, int64_t N, int64_t K) {
  const int64_t blocks = N / R;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* block = w + b * R * K;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
      for (int r = 0; r < R; ++r) {
        const uint16_t* chunk = Interleaved ? block + k * R + r * 32 : block + r * K + k;
        if (P > 0) _mm_prefetch((const char*)chunk + P, _MM_HINT_T0);
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(chunk), xv);
      }
    }
    for (int r = 0; r < R; ++r) y[b * R + r] = _mm512_reduce_add_ps(acc[r]);
  }
}

torch::Tensor gemv_packed(torch::Tensor w, torch::Tensor x, int64_t rows, int64_t N, int64_t K) {
  auto y = torch::empty({N}, torch::kFloat32);
  auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  if (rows == 8) gemv_rows<8, 0, true>(wp, xp, y.data_ptr<float>(), N, K);
  else gemv_rows<16, 0, true>(wp, xp, y.data_ptr<float>(), N, K);
  return y;
}

torch::Tensor gemv(torch::Tensor w, torch::Tensor x, int64_t rows, int64_t prefetch) {
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % 32 == 0 && N % rows == 0, "shape");
  auto y = torch::empty({N}, torch::kFloat32);
  auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  if (rows == 4 && prefetch == 0) gemv_rows<4, 0, false>(wp, xp, yp, N, K);
  else if (rows == 4) gemv_rows<4, 1024, false>(wp, xp, yp, N, K);
  else if (rows == 8 && prefetch == 0) gemv_rows<8, 0, false>(wp, xp, yp, N, K);
  else gemv_rows<8, 1024, false>(wp, xp, yp, N, K);
  return y;
}

double read_bytes(torch::Tensor w) {
  const int64_t n = w.numel() * 2 / 64;
  const __m512i* p = reinterpret_cast<const __m512i*>(w.data_ptr<at::BFloat16>());
  __m512i acc = _mm512_setzero_si512();
#pragma omp parallel
  {
    __m512i local = _mm512_setzero_si512();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) local = _mm512_xor_si512(local, _mm512_loadu_si512(p + i));
#pragma omp critical
    acc = _mm512_xor_si512(acc, local);
  }
  return (double)_mm512_reduce_add_epi32(acc);
}
"""

SHAPES = [(1280, 768), (768, 768), (6144, 768), (768, 3072)]  # (out, in): qkv, dense, fc+gate, proj
LAYERS = 12


def interleave(w: torch.Tensor, rows: int) -> torch.Tensor:
    """(N, K) -> [N / rows][K / 32][rows][32]: each block of rows interleaved 32 values at a time."""
    n, k = w.shape
    return w.view(n // rows, rows, k // 32, 32).permute(0, 2, 1, 3).contiguous()


def build():
    """Built as the engine's kernels are: linked to the OpenMP runtime torch has loaded (one thread pool)."""
    return cpp_extension.load_inline("bf16_gemv_probe", cpp_sources=[SOURCE],
                                     functions=["gemv", "gemv_packed", "read_bytes"],
                                     extra_cflags=list(kernel_build.CFLAGS), extra_ldflags=kernel_build.ldflags())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ext = build()
    gen = torch.Generator().manual_seed(0)
    plain = [[(torch.randn(o, i, generator=gen) * 0.02).to(torch.bfloat16) for o, i in SHAPES] for _ in range(LAYERS)]
    packed = [[PrepackedLinear(w, None, torch.bfloat16) for w in layer] for layer in plain]
    xs = {i: torch.randn(1, i, generator=gen) for _, i in SHAPES}
    layer_bytes = sum(o * i * 2 for o, i in SHAPES)

    packed_rows = {r: [[interleave(w, r) for w in layer] for layer in plain] for r in (8, 16)}
    # correctness: the GEMV against oneDNN on the same bf16-rounded input (float summation order differs)
    for w, lin in zip(plain[0], packed[0]):
        x = xs[w.shape[1]]
        ref = lin(x)[0]
        got = ext.gemv(w, x[0].to(torch.bfloat16).contiguous(), 4, 0)
        # oneDNN's y is rounded to bf16 (as the engine's): within two bf16 steps of the float32 sum
        assert torch.allclose(got, ref, rtol=2 ** -7, atol=1e-3), (got - ref).abs().max()

    def onednn(layer: int) -> None:
        for lin in packed[layer]:
            lin(xs[lin.in_features])

    def gemv(rows: int, prefetch: int):
        def run(layer: int) -> None:
            for w in plain[layer]:
                ext.gemv(w, xs[w.shape[1]][0].to(torch.bfloat16), rows, prefetch)
        return run

    def gemv_packed(rows: int):
        def run(layer: int) -> None:
            for w, p in zip(plain[layer], packed_rows[rows][layer]):
                ext.gemv_packed(p, xs[w.shape[1]][0].to(torch.bfloat16), rows, *w.shape)
        return run

    for w, p in zip(plain[0], packed_rows[8][0]):
        same = ext.gemv_packed(p, xs[w.shape[1]][0].to(torch.bfloat16), 8, *w.shape)
        assert torch.equal(same, ext.gemv(w, xs[w.shape[1]][0].to(torch.bfloat16), 8, 0))

    def read(layer: int) -> None:
        for w in plain[layer]:
            ext.read_bytes(w)

    kinds = {"oneDNN": onednn, "gemv 4/0": gemv(4, 0), "gemv 4/1024": gemv(4, 1024), "gemv 8/0": gemv(8, 0),
             "gemv 8/1024": gemv(8, 1024), "packed 8": gemv_packed(8), "packed 16": gemv_packed(16), "read": read}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.passes):
        for name, fn in kinds.items():
            start = time.perf_counter()
            for layer in range(LAYERS):
                fn(layer)
            times[name].append((time.perf_counter() - start) / LAYERS)
    print(f"threads {args.threads}, {layer_bytes / 1e6:.1f} MB a layer, {LAYERS} layers cycled; "
          f"median of {args.passes}")
    for name, t in times.items():
        ms = statistics.median(t) * 1e3
        print(f"{name:12s} {ms:6.3f} ms/layer  {layer_bytes / ms / 1e6:5.1f} GB/s  (min {min(t) * 1e3:.3f})")


if __name__ == "__main__":
    main()
