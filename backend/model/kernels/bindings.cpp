// The Python module of the compiled kernels (backend/model/kernels/build.py): one extension, one binding each.
// Both release the GIL while they run, as torch's own operators do: a decode step's layers take milliseconds, and
// the model process's other Python threads (the served engine's response sends) must run meanwhile.
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("paged_decode", &paged_decode, "decode attention over a paged KV cache (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_layers", &decode_layers, "a decode step's decoder layers in one call (float32, CPU)",
        py::call_guard<py::gil_scoped_release>());
}
