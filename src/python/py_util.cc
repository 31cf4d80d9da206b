// The binding's boundary (py_util.h): exceptions, checked array arguments, new arrays, and
// interruptible long calls.
#include "python/py_util.h"

#include <Python.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

namespace fp4moe::python {

namespace {

PyObject* g_error = nullptr;       // fp4moe.Fp4moeError
PyObject* g_type_error = nullptr;  // fp4moe.Fp4moeTypeError
PyObject* g_failed = nullptr;      // fp4moe.Fp4moeFailedError

[[noreturn]] void raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::string_view unit;  // in size messages: "7 bytes, the shape ... needs 8"
  nb::dlpack::dtype dl;
  size_t bytes;
};

const DTypeInfo kDTypes[] = {
    {DType::kUint8, "uint8", "bytes", nb::dtype<uint8_t>(), 1},
    {DType::kUint16, "uint16", "uint16s", nb::dtype<uint16_t>(), 2},
    {DType::kFloat32, "float32", "floats", nb::dtype<float>(), 4},
    {DType::kFloat64, "float64", "doubles", nb::dtype<double>(), 8},
    {DType::kInt32, "int32", "int32s", nb::dtype<int32_t>(), 4},
};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& row : kDTypes) {
    if (row.dtype == dtype) return row;
  }
  FP4MOE_CHECK(false);
  return kDTypes[0];
}

std::string dl_name(nb::dlpack::dtype dl) {
  for (const DTypeInfo& row : kDTypes) {
    if (row.dl == dl) return std::string(row.name);
  }
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string kind = dl.code < 7 ? kinds[dl.code] : "code" + std::to_string(dl.code);
  return kind + std::to_string(dl.bits);
}

// The checks shared by read_array and write_array; `ro` selects the ndarray flavour.
template <class Array>
Array cast_array(nb::handle obj, const char* name, DType dtype, std::optional<size_t> ndim) {
  const DTypeInfo& want = info(dtype);
  Array array;
  if (!nb::try_cast(obj, array, /*convert=*/false)) {
    const std::string got = nb::type_name(obj.type()).c_str();
    if constexpr (std::is_same_v<Array, nb::ndarray<>>) {
      nb::ndarray<nb::ro> read_only;
      if (nb::try_cast(obj, read_only, false)) {
        raise_bad_input("argument '" + std::string(name) + "': a read-only " + got +
                        ", expected a writable array");
      }
    }
    raise_type_error("argument '" + std::string(name) + "': expected a numpy array or CPU " +
                     "tensor of " + std::string(want.name) + ", got " + got);
  }
  if (array.device_type() != nb::device::cpu::value) {
    raise_type_error("argument '" + std::string(name) +
                     "': not in CPU memory (the kernels run on the CPU; pass .cpu())");
  }
  if (array.dtype() != want.dl) {
    raise_type_error("argument '" + std::string(name) + "': dtype " + dl_name(array.dtype()) +
                     ", expected " + std::string(want.name));
  }
  std::vector<size_t> shape(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) shape[i] = array.shape(i);
  if (ndim.has_value() && array.ndim() != *ndim) {
    raise_bad_input("argument '" + std::string(name) + "': shape " + shape_string(shape) +
                    ", expected " + std::to_string(*ndim) + " dimensions");
  }
  if (!ndim.has_value() && array.ndim() < 1) {
    raise_bad_input("argument '" + std::string(name) +
                    "': a 0-d array, expected at least 1 dimension");
  }
  // C order: each stride (in elements) is the product of the later extents; extents of 1 may
  // have any stride.
  int64_t expected = 1;
  for (size_t i = array.ndim(); i-- > 0;) {
    if (shape[i] != 1 && array.stride(i) != expected) {
      std::string strides;
      for (size_t j = 0; j < array.ndim(); ++j) {
        strides += (j ? ", " : "") + std::to_string(array.stride(j));
      }
      raise_bad_input("argument '" + std::string(name) + "': not C-contiguous (shape " +
                      shape_string(shape) + ", strides [" + strides + "] elements); pass a " +
                      "contiguous copy (np.ascontiguousarray / .contiguous())");
    }
    expected *= static_cast<int64_t>(shape[i]);
  }
  if (reinterpret_cast<uintptr_t>(array.data()) % want.bytes != 0) {
    raise_bad_input("argument '" + std::string(name) + "': not aligned to its " +
                    std::string(want.name) + " elements");
  }
  return array;
}

}  // namespace

void create_exceptions(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "fp4moe.Fp4moeError",
      "Bad input: the message names the argument, file or tensor and the reason.", PyExc_ValueError,
      nullptr);
  nb::object bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_TypeError));
  g_type_error = PyErr_NewExceptionWithDoc(
      "fp4moe.Fp4moeTypeError",
      "An argument of the wrong type or dtype (a cast would turn codes into other codes).",
      bases.ptr(), nullptr);
  g_failed = PyErr_NewExceptionWithDoc(
      "fp4moe.Fp4moeFailedError",
      "The input was fine but the operation failed (I/O, an output check).", PyExc_RuntimeError,
      nullptr);
  if (g_error == nullptr || g_type_error == nullptr || g_failed == nullptr) {
    throw nb::python_error();
  }
  m.attr("Fp4moeError") = nb::handle(g_error);
  m.attr("Fp4moeTypeError") = nb::handle(g_type_error);
  m.attr("Fp4moeFailedError") = nb::handle(g_failed);
}

void raise_bad_input(const std::string& message) { raise(g_error, message); }
void raise_type_error(const std::string& message) { raise(g_type_error, message); }

void raise_error(const Error& error) {
  switch (error.kind) {
    case ErrorKind::kBadInput:
      raise(g_error, error.message);
    case ErrorKind::kFailed:
      raise(g_failed, error.message);
    case ErrorKind::kInterrupted:
      raise(PyExc_KeyboardInterrupt, error.message);
  }
  raise(g_failed, error.message);
}

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

std::string shape_string(const std::vector<size_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

ArrayArg<const void> read_array(nb::handle obj, const char* name, DType dtype,
                                std::optional<size_t> ndim) {
  auto array = cast_array<nb::ndarray<nb::ro>>(obj, name, dtype, ndim);
  ArrayArg<const void> out{array.data(), {}, array.size()};
  for (size_t i = 0; i < array.ndim(); ++i) out.shape.push_back(array.shape(i));
  return out;
}

ArrayArg<void> write_array(nb::handle obj, const char* name, DType dtype,
                           std::optional<size_t> ndim) {
  auto array = cast_array<nb::ndarray<>>(obj, name, dtype, ndim);
  ArrayArg<void> out{array.data(), {}, array.size()};
  for (size_t i = 0; i < array.ndim(); ++i) out.shape.push_back(array.shape(i));
  return out;
}

void check_size(const char* name, size_t got, DType dtype, size_t needed,
                const std::vector<int64_t>& shape) {
  if (got == needed) return;
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  raise_bad_input("argument '" + std::string(name) + "': " + std::to_string(got) + " " +
                  std::string(info(dtype).unit) + ", the shape [" + dims + "] needs " +
                  std::to_string(needed));
}

bool is_torch(nb::handle obj) {
  nb::handle type = obj.type();
  if (!nb::hasattr(type, "__module__")) return false;
  const std::string module = nb::cast<std::string>(nb::str(type.attr("__module__")));
  return module == "torch" || module.rfind("torch.", 0) == 0;
}

NewArray new_array(const std::vector<size_t>& shape, DType dtype, bool torch) {
  const DTypeInfo& row = info(dtype);
  size_t count = 1;
  for (size_t extent : shape) count *= extent;
  // 64-byte aligned storage owned by a capsule that the array (or tensor) keeps alive.
  void* data = ::operator new[](count* row.bytes + 1, std::align_val_t{64});
  nb::capsule owner(data, [](void* p) noexcept { ::operator delete[](p, std::align_val_t{64}); });
  NewArray out;
  out.data = data;
  if (torch) {
    out.array = nb::cast(
        nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr, row.dl));
  } else {
    out.array =
        nb::cast(nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, row.dl));
  }
  return out;
}

nb::object numpy_float32(float value) {
  return nb::module_::import_("numpy").attr("float32")(value);
}

nb::object json_to_python(const std::string& dumped) {
  return nb::module_::import_("json").attr("loads")(dumped);
}

void Interruptible::run(const std::function<void()>& work) {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr thrown;
  std::thread worker([&] {
    try {
      work();
    } catch (...) {
      thrown = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    done_cv.notify_all();
  });
  for (;;) {
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mutex);
      if (done_cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) break;
    }
    // Python runs signal handlers only on the main thread, between bytecodes: here, for Ctrl-C.
    if (!cancel_.load() && PyErr_CheckSignals() != 0) {
      pending_.emplace();  // takes the KeyboardInterrupt (or the handler's exception)
      cancel_.store(true);
    }
  }
  {
    nb::gil_scoped_release release;
    worker.join();
  }
  if (pending_.has_value()) {
    nb::python_error error = std::move(*pending_);
    pending_.reset();
    throw error;
  }
  if (thrown) std::rethrow_exception(thrown);
}

void Interruptible::call_python(const std::function<void()>& fn) {
  nb::gil_scoped_acquire acquire;
  if (cancel_.load()) return;
  try {
    fn();
  } catch (nb::python_error& error) {
    pending_.emplace(std::move(error));
    cancel_.store(true);
  }
}

}  // namespace fp4moe::python
