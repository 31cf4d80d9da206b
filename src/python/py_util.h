// The binding's boundary: the Python exceptions, Error -> exception, array arguments checked
// (dtype, shape, C-contiguity, CPU memory, size) with the argument's name, and new output arrays
// in the caller's framework (numpy, or torch for torch inputs: zero-copy through DLPack).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace fp4moe::python {

namespace nb = nanobind;

// fp4moe.Fp4moeError (ValueError): bad input; fp4moe.Fp4moeTypeError (also TypeError): an argument
// of the wrong type or dtype; fp4moe.Fp4moeFailedError (RuntimeError): the input was fine but the
// operation failed (I/O, an output check). Created once by the module.
void create_exceptions(nb::module_& m);
[[noreturn]] void raise_bad_input(const std::string& message);
[[noreturn]] void raise_type_error(const std::string& message);
// By ErrorKind: bad input, failed, or KeyboardInterrupt for an interrupted operation.
[[noreturn]] void raise_error(const Error& error);

template <class T>
T unwrap(Result<T>&& result) {
  if (!result.ok()) raise_error(result.error());
  return std::move(result).value();
}
inline void unwrap(const Status& status) {
  if (!status.ok()) raise_error(status.error());
}

// A checked array argument: its data (read-only or writable) and shape. `owner` keeps the
// caller's buffer alive while the view is in use.
template <class T>
struct ArrayArg {
  T* data = nullptr;
  std::vector<size_t> shape;
  size_t size = 0;
};

enum class DType { kUint8, kUint16, kFloat32, kFloat64, kInt32 };
std::string_view dtype_name(DType dtype);

// Reads `obj` (a numpy array, a CPU torch tensor, anything with DLPack or the buffer protocol)
// without a copy or a cast. Errors name `name`: not an array or on another device (type error),
// dtype other than `dtype` (type error), `ndim` dimensions when given (else at least one), not
// C-contiguous, read-only when `writable`.
ArrayArg<const void> read_array(nb::handle obj, const char* name, DType dtype,
                                std::optional<size_t> ndim = std::nullopt);
ArrayArg<void> write_array(nb::handle obj, const char* name, DType dtype,
                           std::optional<size_t> ndim = std::nullopt);

template <class T>
ArrayArg<const T> typed(const ArrayArg<const void>& a) {
  return {static_cast<const T*>(a.data), a.shape, a.size};
}
template <class T>
ArrayArg<T> typed(const ArrayArg<void>& a) {
  return {static_cast<T*>(a.data), a.shape, a.size};
}
template <class T>
std::span<const T> span_of(const ArrayArg<const T>& a) {
  return {a.data, a.size};
}

// The size the shape needs, exactly: "argument 'scales': 7 bytes, the shape [4, 32] needs 8".
void check_size(const char* name, size_t got, DType dtype, size_t needed,
                const std::vector<int64_t>& shape);
std::string shape_string(const std::vector<size_t>& shape);

// Whether `obj` is a torch tensor (outputs then are torch tensors too).
bool is_torch(nb::handle obj);

// A new C-contiguous array that the caller fills through `data`.
struct NewArray {
  nb::object array;
  void* data = nullptr;
};
NewArray new_array(const std::vector<size_t>& shape, DType dtype, bool torch = false);

// np.float32(value): the tensor scales, so their bits can be compared.
nb::object numpy_float32(float value);
// A JSON value (nlohmann) as Python objects, through the json module: dicts, lists, numbers.
nb::object json_to_python(const std::string& dumped);

// Runs `work` (which must not touch Python objects) on its own thread while this thread waits with
// the GIL released and, every 50 ms, runs Python's signal handlers: Ctrl-C sets `cancel`, `work`
// stops at its next check, and the KeyboardInterrupt is raised here after it returned.
// `report_error` is how a callback (called with the GIL held, see CallbackGuard) stores an
// exception of its own: it cancels too, and is re-raised.
class Interruptible {
 public:
  // Runs `work`; afterwards rethrows a Python exception caught meanwhile (signal or callback).
  void run(const std::function<void()>& work);
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }
  // Calls `fn` with the GIL held (from the worker thread); a Python exception it raises cancels
  // the work and is kept for run() to raise.
  void call_python(const std::function<void()>& fn);

 private:
  std::atomic<bool> cancel_{false};
  std::optional<nb::python_error> pending_;
};

}  // namespace fp4moe::python
