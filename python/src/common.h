#pragma once
// Shared by the binding files: NumPy array types and fresh output arrays.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>

#include "veloxquant/model.h"

namespace vqpy {
namespace nb = nanobind;

// Inputs: C-contiguous CPU arrays of one dtype. nanobind converts other layouts or dtypes once
// (a copy); matching arrays are read in place.
template <typename T, size_t N>
using In = nb::ndarray<const T, nb::ndim<N>, nb::c_contig, nb::device::cpu>;

// A new C-contiguous NumPy array whose memory the array itself owns (no copy on return).
template <typename T>
nb::ndarray<nb::numpy, T> new_array(std::initializer_list<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* data = new T[n > 0 ? n : 1];
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.begin(), owner);
}

// A read-only view of memory that `owner` (a Python object) keeps alive.
template <typename T>
nb::ndarray<nb::numpy, const T> view(const T* data, std::initializer_list<size_t> shape, nb::handle owner) {
  return nb::ndarray<nb::numpy, const T>(data, shape.size(), shape.begin(), owner);
}

// Text from the model may end inside a UTF-8 sequence (a generation cut at max_new_tokens):
// invalid bytes become U+FFFD rather than an exception.
inline nb::str utf8(const std::string& s) {
  return nb::steal<nb::str>(PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace"));
}

// Calls a Python callable from C++ code running without the GIL (engine callbacks): takes the GIL,
// and reads a None result as "go on" so that callbacks need not return anything.
template <typename... A>
bool call_python(PyObject* f, A... args) {
  nb::gil_scoped_acquire gil;
  nb::object r = nb::borrow(f)(args...);
  return r.is_none() || nb::cast<bool>(r);
}

void bind_codec(nb::module_& m);
// bind_model returns the Model class for bind_generate to add generate/perplexity to.
nb::class_<veloxquant::Model> bind_model(nb::module_& m);
void bind_generate(nb::module_& m, nb::class_<veloxquant::Model>& model);
void bind_engine(nb::module_& m);
void bind_server(nb::module_& m);

}  // namespace vqpy
