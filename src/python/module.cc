// fp4moe._fp4moe: the Python module, a thin binding of the public C++ API (python/fp4moe
// re-exports it). No logic lives here that the library does not have: names are parsed, arrays
// checked and errors turned into exceptions.
#include <nanobind/nanobind.h>

#include "python/py_util.h"

namespace fp4moe::python {
void register_formats(nb::module_& m);
void register_kernels(nb::module_& m);
void register_checkpoint(nb::module_& m);
}  // namespace fp4moe::python

NB_MODULE(_fp4moe, m) {
  namespace py = fp4moe::python;
  m.doc() =
      "fp4moe: FP4 Mixture-of-Experts checkpoints detected exactly, converted losslessly and run "
      "on CPU kernels.";
  m.attr("__version__") = FP4MOE_VERSION;
  py::create_exceptions(m);
  py::register_formats(m);
  py::register_kernels(m);
  py::register_checkpoint(m);
}
