#pragma once
// AlignedBuffer<T>: an owning, 64-byte-aligned array of trivially copyable T. Large buffers
// (kHugeBytes and more: packed weights, KV pools) are aligned to 2 MiB and, on Linux, marked for
// transparent huge pages before they are first touched: with the common THP mode "madvise", a
// 1 GB weight copy then takes ~500 page faults instead of ~260k, and the products that stream
// it miss the TLB far less.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace vq {

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "AlignedBuffer holds trivially copyable types");

 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kHugeAlign = size_t(2) << 20;
  static constexpr size_t kHugeBytes = size_t(8) << 20;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  AlignedBuffer(const AlignedBuffer& o) : AlignedBuffer(o.n_) {
    if (n_) std::memcpy(p_, o.p_, n_ * sizeof(T));
  }
  AlignedBuffer& operator=(const AlignedBuffer& o) {
    if (this != &o) {
      AlignedBuffer t(o);
      swap(t);
    }
    return *this;
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept { swap(o); }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~AlignedBuffer() { std::free(p_); }

  // Resizes, keeping the first min(old, new) elements; new elements are zeroed.
  void resize(size_t n) {
    if (n == n_) return;
    T* q = nullptr;
    if (n) {
      const bool huge = n * sizeof(T) >= kHugeBytes;
      const size_t align = huge ? kHugeAlign : kAlign;
      const size_t bytes = ((n * sizeof(T) + align - 1) / align) * align;
      q = static_cast<T*>(std::aligned_alloc(align, bytes));
      if (!q) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (huge) (void)::madvise(static_cast<void*>(q), bytes, MADV_HUGEPAGE);  // advice only: may be refused
#endif
      const size_t keep = n < n_ ? n : n_;
      if (keep) std::memcpy(q, p_, keep * sizeof(T));
      if (n > keep) std::memset(static_cast<void*>(q + keep), 0, (n - keep) * sizeof(T));
    }
    std::free(p_);
    p_ = q;
    n_ = n;
  }
  void swap(AlignedBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace vq
