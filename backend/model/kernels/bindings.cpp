// The Python module of the compiled kernels (backend/model/kernels/build.py): one extension, one binding each.
// The kernels release the GIL while they run, as torch's own operators do: a decode step's layers take milliseconds, and
// the model process's other Python threads (the served engine's response sends) must run meanwhile.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("paged_decode", &paged_decode, "decode attention over a paged KV cache (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("rotate_and_store", &rotate_and_store_rows_checked,
        "rotary on q / k and the K/V rows into the pools in one pass: q (T, H, d), or None where it does not apply",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_layers", &decode_layers, "a decode step's decoder layers in one call (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("pool_lines", &pool_lines,
        "the K/V lines a GEMV asks for ahead of an attention, as (pool, byte offset) rows (for tests)");
  m.def("bf16_gemv_rows_ahead", &bf16_gemv_rows_ahead, "bf16_gemv asking for those lines meanwhile (for tests)",
        py::call_guard<py::gil_scoped_release>());
  m.def("causal_prefill", &causal_prefill, "causal attention of prompts prefilled from position 0 (bf16 K/V, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("causal_prefill_available", &causal_prefill_available,
        "whether causal_prefill was compiled (the CPU has AVX-512 BF16)");
  m.def("bf16_gemv", [](const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
    return bf16_gemv(x, packed, bias);
  }, "a bf16 linear of 1-16 rows over interleaved weights (AVX-512 BF16, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("bf16_gemv_available", &bf16_gemv_available, "whether bf16_gemv was compiled (the CPU has AVX-512 BF16)");
  m.def("f32_gemv", &f32_gemv, "a float32 linear of 1-16 rows over its row-major weight (AVX2 + FMA, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("norm_rows_exact", &norm_rows_exact, "whether the norms give ATen's bits here (its AVX2 or AVX-512 kernels)");
  m.def("silu_rows_exact", &silu_rows_exact,
        "whether SiLU(gate) * up gives ATen's bits here (its AVX2 or AVX-512 kernels)");
  m.def("rms_norm_rows", &rms_norm_rows, "RMS norm of float32 rows (ATen's bits under norm_rows_exact)",
        py::call_guard<py::gil_scoped_release>());
  m.def("add_rms_norm_rows", &add_rms_norm_rows, "x + delta and its RMS norm (ATen's bits under norm_rows_exact)",
        py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul_rows", &silu_mul_rows, "silu(gate) * up over float32 rows (ATen's bits under silu_rows_exact)",
        py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul_bf16_rows", &silu_mul_bf16_rows,
        "bf16 [gate | up] rows -> bf16(silu(gate) * up) (ATen's bits under silu_rows_exact)",
        py::call_guard<py::gil_scoped_release>());
  m.def("aten_grain_size", [] { return at::internal::GRAIN_SIZE; },
        "ATen's at::internal::GRAIN_SIZE: the elements a parallel ATen kernel leaves to one thread");
  m.def("f32_gemv_available", &f32_gemv_available, "whether f32_gemv was compiled (the CPU has AVX2 + FMA)");
}
