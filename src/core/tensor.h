#pragma once
// TensorView<T>: a non-owning, row-major view with its shape stated (up to 4 dims).
// Shapes are checked where views are made; at() is bounds-checked only in debug builds.
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace vq {

using Shape = std::array<int64_t, 4>;

inline std::string shape_str(const int64_t* s, int rank) {
  std::string out = "[";
  for (int i = 0; i < rank; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

template <typename T>
class TensorView {
 public:
  TensorView() = default;
  TensorView(T* data, std::initializer_list<int64_t> shape) : data_(data), rank_(int(shape.size())) {
    VQ_CHECK(rank_ >= 1 && rank_ <= 4, "TensorView: rank {} not in 1..4", rank_);
    int i = 0;
    for (int64_t d : shape) {
      VQ_CHECK(d >= 0, "TensorView: negative dimension {} in shape", d);
      shape_[i++] = d;
    }
    for (; i < 4; ++i) shape_[i] = 1;
  }
  T* data() const { return data_; }
  int rank() const { return rank_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= shape_[i];
    return n;
  }
  std::string shape_string() const { return shape_str(shape_.data(), rank_); }
  // Throws naming `what` unless the view has exactly this shape.
  void expect_shape(const char* what, std::initializer_list<int64_t> s) const {
    bool ok = int(s.size()) == rank_;
    int i = 0;
    for (int64_t d : s) ok = ok && shape_[i++] == d;
    if (!ok) {
      std::array<int64_t, 4> e{};
      i = 0;
      for (int64_t d : s) e[i++] = d;
      VQ_FAIL("{}: shape {} expected {}", what, shape_string(), shape_str(e.data(), int(s.size())));
    }
  }
  T& at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    assert(i0 < shape_[0] && i1 < shape_[1] && i2 < shape_[2] && i3 < shape_[3]);
    return data_[((i0 * shape_[1] + i1) * shape_[2] + i2) * shape_[3] + i3];
  }

 private:
  T* data_ = nullptr;
  int rank_ = 0;
  Shape shape_{1, 1, 1, 1};
};

}  // namespace vq
