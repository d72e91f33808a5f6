// The Python module of the compiled kernels (backend/model/kernels/build.py): one extension, one binding each.
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention over a paged KV cache (float32, CPU)");
  m.def("decode_layers", &decode_layers, "a decode step's decoder layers in one call (float32, CPU)");
}
