// The compiled kernels' entry points (backend/model/kernels/build.py builds them into one extension).
// torch/types.h (ATen, torch::Tensor, the factories), not torch/extension.h: only bindings.cpp needs pybind11 and
// torch's whole C++ API, which take half of each source's parse (33 s against 15 s per file here).
#pragma once
#include <torch/types.h>

#include "pool_lines.h"

#include <optional>
#include <vector>

// paged_decode.cpp: decode attention read in place from the paged KV pool.
torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& slots, const torch::Tensor& col_start, const torch::Tensor& col_end,
                           double scale, double softcap);

// decode_layers.cpp: a step's rotary on q and k and its K/V rows into the pools in one pass, where it applies (float32
// qkv (T, (H + 2 KV) d), float32 or bf16 pools); returns q (T, H, d), nullopt where it does not apply.
std::optional<torch::Tensor> rotate_and_store_rows_checked(const torch::Tensor& qkv, int64_t H, int64_t KV, int64_t d,
                                                           const torch::Tensor& cos, const torch::Tensor& sin_signed,
                                                           const torch::Tensor& slots, const torch::Tensor& k_pool,
                                                           const torch::Tensor& v_pool);
// decode_layers.cpp: every decoder layer of a decode step in one call, the same arithmetic as decoder.py.
torch::Tensor decode_layers(torch::Tensor x, const std::vector<torch::Tensor>& weights,
                            const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
                            const std::vector<torch::Tensor>& col_starts, const std::vector<torch::Tensor>& col_ends,
                            const torch::Tensor& slot_mapping, const torch::Tensor& cos,
                            const torch::Tensor& sin_signed, const torch::Tensor& context_slots,
                            const std::vector<int64_t>& dims, const std::vector<double>& scalars);

// decode_layers.cpp: the lines the proj GEMV asks for ahead of the next layer's attention, for tests: (pool: 0 K,
// 1 V; byte offset from that pool's first byte) per line, sequences [first, last) (pool_lines.h).
torch::Tensor pool_lines(const torch::Tensor& k_pool, const torch::Tensor& v_pool, const torch::Tensor& context_slots,
                         const torch::Tensor& col_start, const torch::Tensor& col_end, int64_t first, int64_t last);
// ... and bf16_gemv asking for them (for tests).
torch::Tensor bf16_gemv_rows_ahead(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& k_pool,
                                   const torch::Tensor& v_pool, const torch::Tensor& context_slots,
                                   const torch::Tensor& col_start, const torch::Tensor& col_end);

// causal_prefill.cpp: causal attention of prompts prefilled from position 0, bf16 products (AVX-512 BF16 CPUs).
bool causal_prefill_available();
torch::Tensor causal_prefill(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& seqs, double scale);

// bf16_gemv.cpp: a bf16 linear of 1 to kGemvMaxRows rows over weights interleaved by bf16_gemv.py (AVX-512 BF16
// CPUs); more rows go to oneDNN (bf16_gemv.py's MAX_ROWS mirrors it).
constexpr int64_t kGemvMaxRows = 16;
// then: the interleaved copy of the bf16 linear that runs next (decode_layers.cpp), or an empty tensor; ahead: pool
// rows the next attention reads, asked for meanwhile (pool_lines.h), or nullptr.
bool bf16_gemv_available();
torch::Tensor bf16_gemv(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                        const torch::Tensor& then = torch::Tensor(), const PoolRowsAhead* ahead = nullptr);

// f32_gemv.cpp: a float32 linear of 1 to kGemvMaxRows rows over its row-major weight (AVX2 + FMA CPUs).
bool f32_gemv_available();
torch::Tensor f32_gemv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// row_ops.cpp: RMS norm (after a residual add) and SiLU(gate) * up over float32 rows, ATen's bits where ATen runs its
// AVX2 or AVX-512 kernels (norm_rows_exact(), silu_rows_exact(): where the AVX-512 ones are checked alike); AVX2 + FMA
// builds only.
bool norm_rows_exact();
bool silu_rows_exact();
torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& w, double eps);
std::vector<torch::Tensor> add_rms_norm_rows(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& w,
                                             double eps);
torch::Tensor silu_mul_rows(const torch::Tensor& gate, const torch::Tensor& up);
// (T, 2 I) bf16 [gate | up] (a bf16 linear's output) -> (T, I) bf16: bf16(silu(float(gate)) * float(up)), the bits of
// widening both halves, silu_mul_rows and .to(torch.bfloat16), in one pass (a prefill's MLP beside bf16 linears)
torch::Tensor silu_mul_bf16_rows(const torch::Tensor& fc);
